package rls

import (
	"strings"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/rls/config"
)

// Where a descriptor's bucket lives: the bucket (the limiter's zone name)
// says whose rules count it, the client key whose bucket it is.
//
// A bucket name is "rls/<domain>/<unit>" ("rls/api/minute"), and
// "/<algorithm>" after it for any algorithm but fixed_window: the
// service's own namespace, since a rate_limit zone's name cannot hold a
// slash, so that no descriptor can name a zone's bucket, nor a zone a
// descriptor's. Rules of one domain and unit share the name as the
// reference's counters do (its key has the domain, the entries and the
// window, not the rule), so a request's own limit counts in the bucket
// of the configuration's rule for the same entries.
//
// The client key is the descriptor's entries, "key=value" joined by "&"
// (a share_threshold wildcard's pattern standing for the value, as the
// reference counts), every byte outside a plain set escaped as %XX so
// that no two entry lists give one key, and then bounded as HTTP keys are
// (limiter.ClientKey): kept when short and plain, else hashed, so that a
// hostile value can neither grow the store nor break the key.

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
