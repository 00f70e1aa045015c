package redistest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// logTail is how much of a log a failed test prints.
const logTail = 16 << 10

// logOnFailure prints the end of the log file at path when the test has
// failed, if t can tell (Failed and Logf, as testing.TB has).
func logOnFailure(t T, name, path string) {
	ft, ok := t.(interface {
		Failed() bool
		Logf(format string, args ...any)
	})
	if !ok {
		return
	}
	t.Cleanup(func() {
		if !ft.Failed() {
			return
		}
		b, err := os.ReadFile(path)
		if err != nil {
			ft.Logf("%s: no log (%v)", name, err)
			return
		}
		cut := ""
		if len(b) > logTail {
			b, cut = b[len(b)-logTail:], " (its end)"
		}
		ft.Logf("log of %s%s, %s:\n%s", name, cut, path, b)
	})
}

// pollInterval is how often the waits below look again.
const pollInterval = 50 * time.Millisecond

// waitUntil calls check until it reports done, and fails the test with
// what, the timeout and check's last description of the state when that
// takes longer than timeout. It returns how long it waited.
func waitUntil(t T, timeout time.Duration, what string, check func() (done bool, state string)) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		done, state := check()
		if done {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s: not done within %s; last state:\n%s\n(the servers' logs are printed at the end of the test)", what, timeout, state)
		}
		time.Sleep(pollInterval)
	}
}

// runCLI runs redis-cli with args (and REDISCLI_AUTH=password when set),
// bounded by timeout, appends its output to the file logPath and returns
// it. It fails the test when redis-cli fails, times out or reports an
// error ("[ERR]").
func runCLI(t T, timeout time.Duration, logPath, password string, args ...string) string {
	t.Helper()
	requireBinary(t, "redis-cli")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "redis-cli", args...)
	cmd.WaitDelay = time.Second
	cmd.Env = append(os.Environ(), "TERM=dumb") // no colour codes in the output
	if password != "" {
		cmd.Env = append(cmd.Env, "REDISCLI_AUTH="+password)
	}
	out, err := cmd.CombinedOutput()
	if f, ferr := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); ferr == nil {
		_, _ = f.WriteString("$ redis-cli " + strings.Join(args, " ") + "\n")
		_, _ = f.Write(out)
		_ = f.Close()
	}
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		t.Fatalf("redis-cli %s: not done within %s; its output (also in %s):\n%s", strings.Join(args, " "), timeout, filepath.Base(logPath), out)
	case err != nil:
		t.Fatalf("redis-cli %s: %v; its output:\n%s", strings.Join(args, " "), err, out)
	case strings.Contains(string(out), "[ERR]"):
		t.Fatalf("redis-cli %s reported an error; its output:\n%s", strings.Join(args, " "), out)
	}
	return string(out)
}
