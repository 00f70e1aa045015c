//go:build unix

// Package cdp drives a headless Chromium through the Chrome DevTools
// Protocol, for tests that look at a page the way a person would: load it,
// read its DOM, take a screenshot. It is the few calls those tests need on
// a minimal WebSocket client of its own (RFC 6455, client side, no
// extensions), so the project needs no browser automation dependency.
package cdp

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// FindChromium returns the path of a Chromium or Chrome binary: $CHROMIUM
// if set, else the first of the usual names on PATH; "" if there is none.
func FindChromium() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Browser is a headless Chromium process with a fresh profile.
type Browser struct {
	cmd     *exec.Cmd
	profile string
	debug   string // host:port of the DevTools HTTP endpoint
	stderr  *lockedBuffer
	exited  chan struct{}
}

var listening = regexp.MustCompile(`DevTools listening on (ws://[^\s]+)`)

// Launch starts bin headless with a fresh profile in a temporary directory,
// a window of width×height pixels, and the DevTools endpoint on a free
// loopback port. Close stops it.
func Launch(bin string, width, height int) (*Browser, error) {
	profile, err := os.MkdirTemp("", "cdp-profile-")
	if err != nil {
		return nil, err
	}
	b := &Browser{profile: profile, stderr: &lockedBuffer{}, exited: make(chan struct{})}
	b.cmd = exec.Command(bin,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-default-apps", "--disable-extensions", "--no-first-run", "--no-default-browser-check",
		"--mute-audio", "--hide-scrollbars", "--force-device-scale-factor=1",
		fmt.Sprintf("--window-size=%d,%d", width, height),
		"--user-data-dir="+profile,
		"--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
		"about:blank")
	// Its own process group, so that Close stops its helper processes too.
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw := io.Pipe()
	b.cmd.Stderr = pw
	b.cmd.Stdout = b.stderr
	if err := b.cmd.Start(); err != nil {
		os.RemoveAll(profile)
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			b.stderr.Write([]byte(line + "\n"))
			if m := listening.FindStringSubmatch(line); m != nil && !sent {
				found <- m[1]
				sent = true
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		_ = b.cmd.Wait()
		pw.Close()
		close(b.exited)
	}()
	select {
	case ws := <-found:
		u, err := url.Parse(ws)
		if err != nil {
			b.Close()
			return nil, err
		}
		b.debug = u.Host
		return b, nil
	case <-time.After(30 * time.Second):
		b.Close()
		return nil, fmt.Errorf("chromium did not open its DevTools endpoint in 30s; its output:\n%s", b.stderr.String())
	}
}

// Output returns what the browser printed.
func (b *Browser) Output() string { return b.stderr.String() }

// Close stops the browser and its helpers and removes the profile.
func (b *Browser) Close() {
	if b.cmd != nil && b.cmd.Process != nil {
		_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-b.exited:
		case <-time.After(5 * time.Second):
		}
	}
	os.RemoveAll(b.profile)
}

// NewPage opens a new tab on pageURL and connects to it.
func (b *Browser) NewPage(pageURL string) (*Page, error) {
	req, err := http.NewRequest(http.MethodPut, "http://"+b.debug+"/json/new?"+url.QueryEscape(pageURL), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("opening a tab: %w", err)
	}
	defer resp.Body.Close()
	var target struct {
		ID                   string `json:"id"`
		WebSocketDebuggerURL string `json:"webSocketDebuggerUrl"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&target); err != nil || target.WebSocketDebuggerURL == "" {
		return nil, fmt.Errorf("opening a tab: status %d, %v", resp.StatusCode, err)
	}
	conn, err := dialWebSocket(target.WebSocketDebuggerURL)
	if err != nil {
		return nil, err
	}
	p := &Page{conn: conn, pending: map[int64]chan reply{}}
	go p.readLoop()
	return p, nil
}

// Page is a connection to one tab.
type Page struct {
	conn *wsConn

	mu      sync.Mutex
	next    int64
	pending map[int64]chan reply
	err     error
}

type reply struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// Call sends a DevTools command and decodes its result into result (if not
// nil).
func (p *Page) Call(ctx context.Context, method string, params, result any) error {
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return p.err
	}
	p.next++
	id := p.next
	ch := make(chan reply, 1)
	p.pending[id] = ch
	p.mu.Unlock()
	msg, err := json.Marshal(map[string]any{"id": id, "method": method, "params": params})
	if err != nil {
		return err
	}
	if err := p.conn.writeText(msg); err != nil {
		return err
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return fmt.Errorf("%s: %w", method, p.closedErr())
		}
		if r.Error != nil {
			return fmt.Errorf("%s: %s (%d)", method, r.Error.Message, r.Error.Code)
		}
		if result != nil {
			return json.Unmarshal(r.Result, result)
		}
		return nil
	case <-ctx.Done():
		p.mu.Lock()
		delete(p.pending, id)
		p.mu.Unlock()
		return fmt.Errorf("%s: %w", method, ctx.Err())
	}
}

func (p *Page) closedErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

func (p *Page) readLoop() {
	for {
		msg, err := p.conn.readMessage()
		if err != nil {
			p.mu.Lock()
			p.err = fmt.Errorf("devtools connection: %w", err)
			for id, ch := range p.pending {
				close(ch)
				delete(p.pending, id)
			}
			p.mu.Unlock()
			return
		}
		var head struct {
			ID int64 `json:"id"`
		}
		if json.Unmarshal(msg, &head) != nil || head.ID == 0 {
			continue // an event
		}
		var r reply
		_ = json.Unmarshal(msg, &r)
		p.mu.Lock()
		ch := p.pending[head.ID]
		delete(p.pending, head.ID)
		p.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
}

// Eval evaluates a JavaScript expression in the page (awaiting it if it is
// a promise) and decodes its JSON-serializable value into out.
func (p *Page) Eval(ctx context.Context, expr string, out any) error {
	var res struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	err := p.Call(ctx, "Runtime.evaluate", map[string]any{
		"expression": expr, "returnByValue": true, "awaitPromise": true,
	}, &res)
	if err != nil {
		return err
	}
	if e := res.ExceptionDetails; e != nil {
		return fmt.Errorf("evaluating %q: %s %s", expr, e.Text, e.Exception.Description)
	}
	if out == nil || len(res.Result.Value) == 0 {
		return nil
	}
	return json.Unmarshal(res.Result.Value, out)
}

// Screenshot returns a PNG of the page's viewport.
func (p *Page) Screenshot(ctx context.Context) ([]byte, error) {
	var res struct {
		Data string `json:"data"`
	}
	if err := p.Call(ctx, "Page.captureScreenshot", map[string]any{"format": "png"}, &res); err != nil {
		return nil, err
	}
	return base64.StdEncoding.DecodeString(res.Data)
}

// Close closes the connection to the tab.
func (p *Page) Close() error { return p.conn.close() }

// wsConn is the client end of a WebSocket connection.
type wsConn struct {
	c  net.Conn
	r  *bufio.Reader
	mu sync.Mutex // serializes writes
}

const wsGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

func dialWebSocket(rawURL string) (*wsConn, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "ws" {
		return nil, fmt.Errorf("websocket: unsupported scheme %q", u.Scheme)
	}
	c, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
	if err != nil {
		return nil, err
	}
	var nonce [16]byte
	_, _ = rand.Read(nonce[:])
	key := base64.StdEncoding.EncodeToString(nonce[:])
	req := "GET " + u.RequestURI() + " HTTP/1.1\r\nHost: " + u.Host +
		"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: " + key +
		"\r\nSec-WebSocket-Version: 13\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		c.Close()
		return nil, err
	}
	r := bufio.NewReaderSize(c, 1<<16)
	resp, err := http.ReadResponse(r, &http.Request{Method: http.MethodGet})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("websocket handshake: %w", err)
	}
	sum := sha1.Sum([]byte(key + wsGUID))
	if resp.StatusCode != http.StatusSwitchingProtocols ||
		resp.Header.Get("Sec-WebSocket-Accept") != base64.StdEncoding.EncodeToString(sum[:]) {
		c.Close()
		return nil, fmt.Errorf("websocket handshake: status %d", resp.StatusCode)
	}
	return &wsConn{c: c, r: r}, nil
}

const (
	opContinuation = 0x0
	opText         = 0x1
	opBinary       = 0x2
	opClose        = 0x8
	opPing         = 0x9
	opPong         = 0xA
)

// writeFrame sends one final, masked frame (clients must mask).
func (w *wsConn) writeFrame(op byte, payload []byte) error {
	hdr := make([]byte, 0, 14)
	hdr = append(hdr, 0x80|op)
	switch n := len(payload); {
	case n < 126:
		hdr = append(hdr, 0x80|byte(n))
	case n <= 0xFFFF:
		hdr = append(hdr, 0x80|126)
		hdr = binary.BigEndian.AppendUint16(hdr, uint16(n))
	default:
		hdr = append(hdr, 0x80|127)
		hdr = binary.BigEndian.AppendUint64(hdr, uint64(n))
	}
	var mask [4]byte
	_, _ = rand.Read(mask[:])
	hdr = append(hdr, mask[:]...)
	body := make([]byte, len(payload))
	for i, c := range payload {
		body[i] = c ^ mask[i%4]
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, err := w.c.Write(append(hdr, body...))
	return err
}

func (w *wsConn) writeText(msg []byte) error { return w.writeFrame(opText, msg) }

// readMessage returns the next text or binary message, answering pings and
// joining fragments.
func (w *wsConn) readMessage() ([]byte, error) {
	var msg []byte
	for {
		var h [2]byte
		if _, err := io.ReadFull(w.r, h[:]); err != nil {
			return nil, err
		}
		fin, op := h[0]&0x80 != 0, h[0]&0x0F
		masked := h[1]&0x80 != 0
		n := uint64(h[1] & 0x7F)
		switch n {
		case 126:
			var b [2]byte
			if _, err := io.ReadFull(w.r, b[:]); err != nil {
				return nil, err
			}
			n = uint64(binary.BigEndian.Uint16(b[:]))
		case 127:
			var b [8]byte
			if _, err := io.ReadFull(w.r, b[:]); err != nil {
				return nil, err
			}
			n = binary.BigEndian.Uint64(b[:])
		}
		if n > 256<<20 {
			return nil, errors.New("websocket: frame too large")
		}
		var mask [4]byte
		if masked {
			if _, err := io.ReadFull(w.r, mask[:]); err != nil {
				return nil, err
			}
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(w.r, payload); err != nil {
			return nil, err
		}
		if masked {
			for i := range payload {
				payload[i] ^= mask[i%4]
			}
		}
		switch op {
		case opPing:
			if err := w.writeFrame(opPong, payload); err != nil {
				return nil, err
			}
			continue
		case opPong:
			continue
		case opClose:
			_ = w.writeFrame(opClose, nil)
			return nil, io.EOF
		case opText, opBinary, opContinuation:
			msg = append(msg, payload...)
			if fin {
				return msg, nil
			}
		default:
			return nil, fmt.Errorf("websocket: unknown opcode %d", op)
		}
	}
}

func (w *wsConn) close() error {
	_ = w.writeFrame(opClose, nil)
	return w.c.Close()
}

// lockedBuffer collects output safely across goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// ArtifactDir returns the directory where tests keep what a person may want
// to look at afterwards: $FLEETLIMIT_ARTIFACTS, or fleetlimit-artifacts in
// the system's temporary directory. It creates it.
func ArtifactDir() (string, error) {
	dir := os.Getenv("FLEETLIMIT_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "fleetlimit-artifacts")
	}
	return dir, os.MkdirAll(dir, 0o755)
}
