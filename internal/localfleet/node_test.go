package localfleet

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// fatalT is a redistest.T whose Fatal ends only the goroutine that calls
// it, and records the message, so that a test can look at a failure.
type fatalT struct {
	*testing.T
	mu  sync.Mutex
	msg string
}

func (f *fatalT) Fatal(args ...any) { f.Fatalf("%s", fmt.Sprint(args...)) }

func (f *fatalT) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.msg = fmt.Sprintf(format, args...)
	f.mu.Unlock()
	runtime.Goexit()
}

// TestStartNodeExited: a Caddy that exits at start fails StartNode at
// once, with its output, not after the readiness timeout.
func TestStartNodeExited(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "caddy")
	script := "#!/bin/sh\necho 'Error: loading initial config: boom' >&2\nexit 1\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	ft := &fatalT{T: t}
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		StartNode(ft, bin, "", "respond ok")
	}()
	<-done
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("StartNode took %s to see the exit", took)
	}
	if !strings.Contains(ft.msg, "exited at start") || !strings.Contains(ft.msg, "boom") {
		t.Errorf("StartNode failed with %q, want the exit and the output", ft.msg)
	}
}
