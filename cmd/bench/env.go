package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetlimit/caddy-fleetlimit/internal/progenv"
)

// env runs the test helpers of internal/redistest outside a test (see
// progenv): a failure ends the program, and cleanups (the processes it
// started) run on exit, on a failure and on an interrupt.
type env = progenv.Env

// newEnv returns the benchmark's env, which also stops the processes it
// started when the benchmark is interrupted.
func newEnv() *env {
	e := progenv.New("fleetlimit-bench")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "bench: interrupted; stopping the processes it started")
		e.Close()
		os.Exit(130)
	}()
	return e
}
