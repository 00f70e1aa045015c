// Package progenv runs the test helpers of internal/redistest and
// internal/localfleet outside a test, for the commands under cmd/: a
// failure ends the program, and cleanups run on exit.
package progenv

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// Env stands in for a testing.TB.
type Env struct {
	name     string
	dir      string
	mu       sync.Mutex
	cleanups []func()
	once     sync.Once
}

// New returns an Env for the command name, which prefixes its failures
// and names its temporary directory. It exits 2 if that directory cannot
// be made.
func New(name string) *Env {
	dir, err := os.MkdirTemp("", name+"-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	return &Env{name: name, dir: dir}
}

// Helper does nothing.
func (e *Env) Helper() {}

// Fatal prints args, runs the cleanups and exits 2.
func (e *Env) Fatal(args ...any) {
	fmt.Fprintln(os.Stderr, append([]any{e.name + ":"}, args...)...)
	e.Close()
	os.Exit(2)
}

// Fatalf is Fatal with a format.
func (e *Env) Fatalf(format string, args ...any) { e.Fatal(fmt.Sprintf(format, args...)) }

// Cleanup registers f to run at Close, the last registered first.
// It may be called from several goroutines (fleetcheck starts its nodes
// at once).
func (e *Env) Cleanup(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cleanups = append(e.cleanups, f)
}

// TempDir returns a new directory inside the Env's, removed at Close.
func (e *Env) TempDir() string {
	d, err := os.MkdirTemp(e.dir, "t")
	if err != nil {
		e.Fatal(err)
	}
	return filepath.Clean(d)
}

// Close runs the cleanups and removes the temporary directory; calls after
// the first do nothing.
func (e *Env) Close() {
	e.once.Do(func() {
		e.mu.Lock()
		cleanups := e.cleanups
		e.mu.Unlock()
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
		os.RemoveAll(e.dir)
	})
}
