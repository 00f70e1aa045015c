package fleetlimit

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// count_status: a zone that counts only responses of some statuses charges
// every request before it passes and gives the charge back once the
// response's status is not one it counts.

// statusSet is a set of HTTP statuses, 100 to 599.
type statusSet [10]uint64

// parseStatusSet parses count_status values: codes (401) and classes (4xx).
func parseStatusSet(vals []string) (statusSet, error) {
	var s statusSet
	if len(vals) == 0 {
		return s, errors.New("count_status needs at least one status code or class (401, 4xx)")
	}
	for _, v := range vals {
		if len(v) == 3 && v[1:] == "xx" && v[0] >= '1' && v[0] <= '5' {
			base := int(v[0]-'0') * 100
			for c := base; c < base+100; c++ {
				s.add(c)
			}
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 100 || n > 599 {
			return s, fmt.Errorf("count_status takes status codes from 100 to 599 and classes 1xx to 5xx, got %q", v)
		}
		s.add(n)
	}
	return s, nil
}

func (s *statusSet) add(code int) { s[code/64] |= 1 << (code % 64) }

// has reports whether code is in the set.
func (s *statusSet) has(code int) bool {
	return code >= 0 && code < 640 && s[code/64]&(1<<(code%64)) != 0
}

// statusRecorder remembers the status a response was written with.
type statusRecorder struct {
	*caddyhttp.ResponseWriterWrapper
	status int
}

// WriteHeader records the first final status.
func (w *statusRecorder) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriterWrapper.WriteHeader(code)
}

// Write records an implicit 200.
func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriterWrapper.Write(b)
}

// ReadFrom records an implicit 200 before the body is copied.
func (w *statusRecorder) ReadFrom(r io.Reader) (int64, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriterWrapper.ReadFrom(r)
}

// responseStatus returns the status a request was answered with: the one
// written, else the handler error's (what Caddy's error handling starts
// from), else 200.
func responseStatus(w *statusRecorder, err error) int {
	if w.status != 0 {
		return w.status
	}
	if err != nil {
		if he, ok := errors.AsType[caddyhttp.HandlerError](err); ok && he.StatusCode != 0 {
			return he.StatusCode
		}
		return http.StatusInternalServerError
	}
	return http.StatusOK
}
