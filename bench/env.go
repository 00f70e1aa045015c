package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
)

// env runs the test helpers of internal/redistest outside a test: a
// failure ends the program, and cleanups (the processes it started) run on
// exit, on a failure and on an interrupt.
type env struct {
	dir      string
	mu       sync.Mutex
	cleanups []func()
	once     sync.Once
}

func newEnv() *env {
	dir, err := os.MkdirTemp("", "fleetlimit-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	e := &env{dir: dir}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "bench: interrupted; stopping the processes it started")
		e.close()
		os.Exit(130)
	}()
	return e
}

func (e *env) Helper() {}

func (e *env) Fatal(args ...any) {
	fmt.Fprintln(os.Stderr, append([]any{"bench:"}, args...)...)
	e.close()
	os.Exit(2)
}

func (e *env) Fatalf(format string, args ...any) { e.Fatal(fmt.Sprintf(format, args...)) }

func (e *env) Cleanup(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cleanups = append(e.cleanups, f)
}

func (e *env) TempDir() string {
	d, err := os.MkdirTemp(e.dir, "t")
	if err != nil {
		e.Fatal(err)
	}
	return filepath.Clean(d)
}

func (e *env) close() {
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
