//go:build !unix

package main

import "time"

// processCPU is not measured on this system.
func processCPU() time.Duration { return 0 }

// loadAverage is not known on this system.
func loadAverage() string { return "n/a" }
