package config

import "sort"

// Config is a loaded set of domains and their rules. It does not change once
// built, so any number of goroutines may match against it at once. A nil
// *Config has no domains.
type Config struct {
	domains  map[string]*node
	limits   []*Limit
	warnings []string
}

// Entry is one entry of a request's descriptor: a key and, possibly empty,
// its value.
type Entry struct {
	Key   string
	Value string
}

// node is one level of a domain's descriptor tree: a descriptor of the
// configuration, or the domain itself at the root.
type node struct {
	// key and value are as configured; composite is the key, or
	// key_value when the value is not empty, by which the reference finds
	// a level (so the entry a=b_c finds a configured a_b=c, as there).
	key, value, composite string
	// wildcard: composite ends in "*" and matches values by prefix.
	wildcard bool
	// valueToMetric and shareThreshold are the descriptor's flags.
	valueToMetric, shareThreshold bool
	// source is where the descriptor is written.
	source string

	children map[string]*node
	// wildcards are the children that match by prefix, in the order of
	// the configuration: the first that matches wins.
	wildcards []*node
	// limit is the descriptor's rule, nil when it has none.
	limit *Limit
}

// Domains returns the names of the configured domains, sorted.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	names := make([]string, 0, len(c.domains))
	for d := range c.domains {
		names = append(names, d)
	}
	sort.Strings(names)
	return names
}

// HasDomain reports whether the domain is configured.
func (c *Config) HasDomain(domain string) bool {
	if c == nil {
		return false
	}
	_, ok := c.domains[domain]
	return ok
}

// Limits returns every rule of the configuration, domain by domain in the
// order they were loaded and, within one, in the order they are written.
// The slice is the Config's own: do not change it.
func (c *Config) Limits() []*Limit {
	if c == nil {
		return nil
	}
	return c.limits
}

// Warnings returns what the load accepted but would likely surprise the
// operator, each with the file and line: keys that mean nothing where they
// are written, YAML documents after a file's first.
func (c *Config) Warnings() []string {
	if c == nil {
		return nil
	}
	return c.warnings
}
