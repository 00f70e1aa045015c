package rls

import (
	"strings"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/rls/config"
)

// Where a descriptor's bucket lives: the bucket (bucketName, in the
// service's own "rls/" namespace) says whose rules count it, the client key
// (clientKey, the escaped entries, bounded as limiter.ClientKey bounds HTTP
// keys) whose bucket it is (docs/design.md, "A descriptor's bucket and
// key").

// bucketName returns the bucket name of a domain's rules of one unit and
// algorithm.
func bucketName(domain string, unit config.Unit, alg limiter.Algorithm) string {
	name := "rls/" + limiter.ClientKey(domain) + "/" + strings.ToLower(unit.String())
	if alg != limiter.FixedWindow {
		name += "/" + alg.String()
	}
	return name
}

// plainByte marks the bytes that a client key's entries hold unescaped.
var plainByte = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "-._:@/+~!$*^|" {
		t[c] = true
	}
	return t
}()

// clientKey returns the bounded client key of a descriptor's entries
// that matched l, building it in buf.
func clientKey(l *config.Limit, entries []config.Entry, buf []byte) string {
	k := buf[:0]
	for i, e := range entries {
		if i > 0 {
			k = append(k, '&')
		}
		k = appendEscaped(k, e.Key)
		k = append(k, '=')
		k = appendEscaped(k, l.CounterValue(entries, i))
	}
	return limiter.ClientKey(string(k))
}

// appendEscaped appends s to dst with every byte outside plainByte as %XX.
func appendEscaped(dst []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		if c := s[i]; plainByte[c] {
			dst = append(dst, c)
		} else {
			dst = append(dst, '%', hex[c>>4], hex[c&15])
		}
	}
	return dst
}
