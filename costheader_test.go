package fleetlimit

import (
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestParseCost: a reported cost is a non-negative integer; one beyond
// int64 counts as the largest (the settlement caps it at the burst), and
// anything else leaves the up-front cost.
func TestParseCost(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want int64
		ok   bool
	}{
		{[]string{"500"}, 500, true},
		{[]string{" 7 "}, 7, true},
		{[]string{"0"}, 0, true},
		{[]string{"9223372036854775807"}, math.MaxInt64, true},
		{[]string{"99999999999999999999999"}, math.MaxInt64, true},
		{[]string{"-5"}, 0, false},
		{[]string{"+5"}, 0, false},
		{[]string{"1e3"}, 0, false},
		{[]string{""}, 0, false},
		{nil, 0, false},
	} {
		if got, ok := parseCost(c.in); got != c.want || ok != c.ok {
			t.Errorf("parseCost(%q) = %d, %v; want %d, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

// TestCostRecorder: the recorder reads the cost from the header as the
// status is written (a later removal of the header does not matter), and
// from a trailer, announced or prefixed, which wins over the header.
func TestCostRecorder(t *testing.T) {
	zone := &Zone{costHeader: "X-Tokens-Used"}
	ds := []zoneDecision{{zone: zone}}
	cases := []struct {
		name    string
		handler func(w http.ResponseWriter)
		want    int64
		found   bool
	}{
		{"header", func(w http.ResponseWriter) {
			w.Header().Set("X-Tokens-Used", "500")
			w.WriteHeader(200)
			w.Header().Del("X-Tokens-Used") // as a deferred `header -X-Tokens-Used` would
		}, 500, true},
		{"implicit 200", func(w http.ResponseWriter) {
			w.Header().Set("X-Tokens-Used", "42")
			_, _ = w.Write([]byte("hi"))
		}, 42, true},
		{"announced trailer", func(w http.ResponseWriter) {
			w.Header().Set("Trailer", "X-Tokens-Used")
			w.WriteHeader(200)
			_, _ = w.Write([]byte("streamed"))
			w.Header().Set("X-Tokens-Used", "321")
		}, 321, true},
		{"prefixed trailer over the header", func(w http.ResponseWriter) {
			w.Header().Set("X-Tokens-Used", "10")
			w.WriteHeader(200)
			w.Header().Set(http.TrailerPrefix+"X-Tokens-Used", "77")
		}, 77, true},
		{"invalid", func(w http.ResponseWriter) {
			w.Header().Set("X-Tokens-Used", "lots")
			w.WriteHeader(200)
		}, 0, false},
		{"no response", func(http.ResponseWriter) {}, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := newCostRecorder(httptest.NewRecorder(), ds)
			c.handler(rec)
			rec.readTrailers()
			if got, ok := rec.cost("X-Tokens-Used"); got != c.want || ok != c.found {
				t.Errorf("cost = %d, %v; want %d, %v", got, ok, c.want, c.found)
			}
		})
	}
}
