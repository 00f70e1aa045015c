// Package keyflood sends a flood of HTTP requests that each carry a new
// client key, as an attacker minting keys would: HTTP/1.1 requests
// pipelined over a few keep-alive connections, so that the server, not the
// client, is what the flood measures. It is for tests and the benchmark
// harness, on loopback.
package keyflood

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Flood is one flood's settings.
type Flood struct {
	// Addr is the server's host:port.
	Addr string
	// Path is the request path. Default "/".
	Path string
	// Host is the Host header. Default: Addr.
	Host string
	// Header is the name of the header that carries the key. Default
	// "X-Key".
	Header string
	// Prefix starts every key; the rest is the request's number, so
	// every request has a key never sent before.
	Prefix string
	// Requests is how many requests to send in all.
	Requests int
	// Conns is how many connections send them. Default 4.
	Conns int
	// Depth is how many requests a connection has in flight at once.
	// Default 32.
	Depth int
	// Sent, if set, counts the requests answered so far, for a watcher.
	Sent *atomic.Int64
}

// Result counts a flood's answers.
type Result struct {
	// Status counts the answers by status code.
	Status map[int]int
	// Took is how long the flood ran.
	Took time.Duration
}

// Run sends the flood and waits for every answer, or until ctx ends.
func Run(ctx context.Context, f Flood) (Result, error) {
	if f.Path == "" {
		f.Path = "/"
	}
	if f.Header == "" {
		f.Header = "X-Key"
	}
	if f.Host == "" {
		f.Host = f.Addr
	}
	if f.Conns <= 0 {
		f.Conns = 4
	}
	if f.Depth <= 0 {
		f.Depth = 32
	}
	if f.Sent == nil {
		f.Sent = new(atomic.Int64)
	}
	start := time.Now()
	var next atomic.Int64
	var mu sync.Mutex
	total := Result{Status: map[int]int{}}
	var wg sync.WaitGroup
	errs := make([]error, f.Conns)
	for c := range f.Conns {
		wg.Go(func() {
			status, err := f.conn(ctx, &next)
			errs[c] = err
			mu.Lock()
			for code, n := range status {
				total.Status[code] += n
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	total.Took = time.Since(start)
	return total, errors.Join(errs...)
}

// conn sends requests over one connection, taking their numbers from next,
// until all are sent, and reads the answers as they come.
func (f *Flood) conn(ctx context.Context, next *atomic.Int64) (map[int]int, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", f.Addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()

	status := map[int]int{}
	r := bufio.NewReaderSize(c, 64<<10)
	var buf []byte
	inFlight := 0
	done := false
	for !done || inFlight > 0 {
		// Top the pipeline up to Depth in one write.
		buf = buf[:0]
		for !done && inFlight < f.Depth {
			n := next.Add(1) - 1
			if n >= int64(f.Requests) {
				done = true
				break
			}
			buf = f.appendRequest(buf, n)
			inFlight++
		}
		if len(buf) > 0 {
			if _, err := c.Write(buf); err != nil {
				return status, fmt.Errorf("writing requests: %w", err)
			}
		}
		// Read at least one answer, and all that are already there.
		for inFlight > 0 {
			code, err := readResponse(r)
			if err != nil {
				return status, fmt.Errorf("reading an answer: %w", err)
			}
			status[code]++
			inFlight--
			f.Sent.Add(1)
			if r.Buffered() == 0 && !done {
				break
			}
		}
	}
	return status, nil
}

// appendRequest appends request number n to buf.
func (f *Flood) appendRequest(buf []byte, n int64) []byte {
	buf = append(buf, "GET "...)
	buf = append(buf, f.Path...)
	buf = append(buf, " HTTP/1.1\r\nHost: "...)
	buf = append(buf, f.Host...)
	buf = append(buf, "\r\n"...)
	buf = append(buf, f.Header...)
	buf = append(buf, ": "...)
	buf = append(buf, f.Prefix...)
	buf = strconv.AppendInt(buf, n, 10)
	return append(buf, "\r\n\r\n"...)
}

// readResponse reads one answer with a Content-Length body and returns its
// status code.
func readResponse(r *bufio.Reader) (int, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	// "HTTP/1.1 200 OK\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, fmt.Errorf("malformed status line %q", line)
	}
	code, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, fmt.Errorf("malformed status line %q", line)
	}
	length := int64(0)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		if len(line) <= 2 {
			break
		}
		if k, v, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(k, []byte("Content-Length")) {
			length, err = strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("malformed Content-Length %q", v)
			}
		}
	}
	if _, err := r.Discard(int(length)); err != nil {
		return 0, err
	}
	return code, nil
}
