package config

import (
	"fmt"
	"strings"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// Match returns the rule that applies to a request's descriptor in domain,
// or nil when none does (an unknown domain, no entries, or no rule where the
// entries lead), exactly as the reference's GetLimit finds it. Level by
// level, an entry finds the configured descriptor with its key and value,
// else the first configured wildcard value ("foo*") that the value starts
// with, else the descriptor with its key alone; the rule is the one of the
// descriptor that the last entry finds. A descriptor with more entries
// than the configuration has levels, or fewer than the rule's, matches
// nothing. Match does not allocate for entries whose key and value
// together are shorter than 256 bytes.
func (c *Config) Match(domain string, entries []Entry) *Limit {
	if c == nil {
		return nil
	}
	n := c.domains[domain]
	if n == nil || len(entries) == 0 {
		return nil
	}
	var buf [256]byte
	for i := range entries {
		n = n.find(entries[i], buf[:0])
		switch {
		case n == nil:
			return nil
		case i == len(entries)-1:
			return n.limit
		case len(n.children) == 0:
			return nil
		}
	}
	return nil
}

// find returns the child of n that an entry finds (see Match), or nil;
// buf is space for the entry's key_value.
func (n *node) find(e Entry, buf []byte) *node {
	kv := append(append(append(buf, e.Key...), '_'), e.Value...)
	if c := n.children[string(kv)]; c != nil {
		return c
	}
	for _, w := range n.wildcards {
		if kvHasPrefix(e, w.composite[:len(w.composite)-1]) {
			return w
		}
	}
	return n.children[e.Key]
}

// Override returns the limit that a request's descriptor sets for itself
// (its limit field), which takes the place of the configuration, as in the
// reference: nil, nil when the domain is unknown (the reference then
// applies nothing), and an error for a unit that is not one. The limit is
// named by the entries as the reference names it ("api.user_alice"), each
// key and value bounded as MetricKey bounds them, and has no name,
// replaces or modes.
func (c *Config) Override(domain string, entries []Entry, requestsPerUnit uint32, unit Unit) (*Limit, error) {
	if !c.HasDomain(domain) {
		return nil, nil
	}
	if !unit.Valid() {
		return nil, fmt.Errorf("the descriptor's limit override has no valid unit (%d)", unit)
	}
	var buf [maxMetricKeyLen]byte
	key := append(append(buf[:0], domain...), '.')
	for i, e := range entries {
		if i > 0 {
			key = append(key, '.')
		}
		key = append(key, limiter.ClientKey(e.Key)...)
		if e.Value != "" {
			key = append(append(key, '_'), limiter.ClientKey(e.Value)...)
		}
	}
	return &Limit{
		Domain: domain, FullKey: bounded(key),
		RequestsPerUnit: requestsPerUnit, Unit: unit,
		Algorithm: defaultAlgorithm, Override: true,
	}, nil
}

// How an entry found a level of the configuration.
type matchKind uint8

const (
	byKey      matchKind = iota // the level has the entry's key and no value
	byValue                     // the level has the entry's key and value
	byWildcard                  // the level's value is a wildcard the entry's value starts with
)

// kind tells how the entry e found n, knowing that it did (n is on the
// path of the rule that e's descriptor matched): by key and value if n's
// composite is e's key_value, else by wildcard if n's prefix matches,
// else by key. It is the order in which find looks, so it gives the same
// answer.
func (n *node) kind(e Entry) matchKind {
	c := n.composite
	if len(c) == len(e.Key)+1+len(e.Value) && hasKeyPrefix(c, e.Key) && c[len(e.Key)+1:] == e.Value {
		return byValue
	}
	if n.wildcard && kvHasPrefix(e, c[:len(c)-1]) {
		return byWildcard
	}
	return byKey
}

// hasKeyPrefix reports whether s begins with key and an underscore.
func hasKeyPrefix(s, key string) bool {
	return len(s) > len(key) && s[len(key)] == '_' && s[:len(key)] == key
}

// kvHasPrefix reports whether e's key_value begins with p, without
// building it.
func kvHasPrefix(e Entry, p string) bool {
	if len(p) <= len(e.Key) {
		return e.Key[:len(p)] == p
	}
	return hasKeyPrefix(p, e.Key) && strings.HasPrefix(e.Value, p[len(e.Key)+1:])
}

// sharedValue returns, for an entry that found the share_threshold
// wildcard n, the value that all such entries share: n's composite without
// the entry's key and underscore ("files/*"), as the reference takes it.
func (n *node) sharedValue(e Entry) string {
	if hasKeyPrefix(n.composite, e.Key) {
		return n.composite[len(e.Key)+1:]
	}
	return n.composite
}
