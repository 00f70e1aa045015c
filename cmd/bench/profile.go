package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// profileSeconds is the length of the CPU profile.
const profileSeconds = 10

// profileResult is a CPU profile of Caddy under load on Redis.
type profileResult struct {
	Config  string  // the configuration's name
	Path    string  // the profile, for go tool pprof
	TopPath string  // go tool pprof -top, flat and cumulative
	Top     string  // what TopPath holds
	RPS     float64 // requests per second while profiled
}

// profile loads a fresh Caddy of one configuration, its admin endpoint on,
// and takes a CPU profile from /debug/pprof/profile while wrk runs.
func (b *bench) profile(c config, out string) *profileResult {
	e := b.env
	fmt.Fprintf(os.Stderr, "profiling %s for %ds ...\n", c.Name(), profileSeconds)
	b.redis.MustDo("FLUSHALL")
	proc := startCaddy(e, b.pin, b.bin, b.site(c), true)
	defer proc.Stop()
	if b.warmup > 0 {
		if _, err := runWrk(b.pin, b.script, proc.URL, b.threads, c.Sc.Conns, c.Sc.Keys, b.warmup); err != nil {
			e.Fatal(err)
		}
	}
	type done struct {
		w   wrkResult
		err error
	}
	ch := make(chan done, 1)
	go func() {
		w, err := runWrk(b.pin, b.script, proc.URL, b.threads, c.Sc.Conns, c.Sc.Keys, (profileSeconds+2)*time.Second)
		ch <- done{w, err}
	}()
	time.Sleep(time.Second)
	if err := os.MkdirAll(out, 0o755); err != nil {
		e.Fatal(err)
	}
	base := "caddy-" + c.Store + "-" + c.Sc.ID + "-cpu"
	res := &profileResult{Config: c.Name(), Path: filepath.Join(out, base+".pprof"), TopPath: filepath.Join(out, base+"-top.txt")}
	client := &http.Client{Timeout: (profileSeconds + 20) * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", proc.Admin, profileSeconds))
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: profile:", err)
		<-ch
		return nil
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := <-ch
	if err != nil || resp.StatusCode != 200 {
		fmt.Fprintf(os.Stderr, "bench: profile: status %d, %v\n", resp.StatusCode, err)
		return nil
	}
	if d.err != nil {
		e.Fatal(d.err)
	}
	res.RPS = d.w.RPS()
	if err := os.WriteFile(res.Path, data, 0o644); err != nil {
		e.Fatal(err)
	}
	flat, err1 := exec.Command("go", "tool", "pprof", "-top", "-nodecount=40", res.Path).CombinedOutput()
	cum, err2 := exec.Command("go", "tool", "pprof", "-top", "-cum", "-nodecount=40", res.Path).CombinedOutput()
	if err1 != nil || err2 != nil {
		fmt.Fprintf(os.Stderr, "bench: go tool pprof: %v %v\n%s%s", err1, err2, flat, cum)
		return nil
	}
	res.Top = "## flat\n\n" + string(flat) + "\n## cumulative\n\n" + string(cum)
	if err := os.WriteFile(res.TopPath, []byte(res.Top), 0o644); err != nil {
		e.Fatal(err)
	}
	return res
}
