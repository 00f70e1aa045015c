package config

import (
	"fmt"
	"strings"
)

// builder checks raw domains by the reference's rules and assembles them
// into a Config, one domain at a time.
type builder struct {
	cfg *Config
	// defined says where each domain was first defined.
	defined map[string]string
}

// newBuilder returns a builder of an empty Config.
func newBuilder() *builder {
	return &builder{
		cfg:     &Config{domains: map[string]*node{}},
		defined: map[string]string{},
	}
}

// add checks one domain and adds it. A domain may be defined once.
func (b *builder) add(d *rawDomain) error {
	if d.domain == "" {
		return fmt.Errorf("%s: the domain is empty or missing", d.at)
	}
	if first, dup := b.defined[d.domain]; dup {
		return fmt.Errorf("%s: duplicate domain %q (first defined at %s)", d.at, d.domain, first)
	}
	root := &node{children: map[string]*node{}, source: d.at}
	if err := b.descriptors(root, d.domain, d.domain+".", nil, d.descriptors); err != nil {
		return err
	}
	b.cfg.domains[d.domain] = root
	b.defined[d.domain] = d.at
	return nil
}

// descriptors checks and adds the descriptors of one level under parent.
// parentKey is the parent's full key followed by a dot, and path the
// levels from the domain's first down to parent.
func (b *builder) descriptors(parent *node, domain, parentKey string, path []*node, ds []rawDescriptor) error {
	for i := range ds {
		d := &ds[i]
		if d.key == "" {
			return fmt.Errorf("%s: the descriptor has an empty key", d.at)
		}
		composite := d.key
		if d.value != "" {
			composite += "_" + d.value
		}
		fullKey := parentKey + composite
		if prev := parent.children[composite]; prev != nil {
			return fmt.Errorf("%s: duplicate descriptor %q (first defined at %s)", d.at, fullKey, prev.source)
		}
		n := &node{
			key: d.key, value: d.value, composite: composite,
			wildcard:      strings.HasSuffix(composite, "*"),
			valueToMetric: d.valueToMetric, shareThreshold: d.shareThreshold,
			source: d.at, children: map[string]*node{},
		}
		// A path of its own, so that no two rules share a backing array.
		nodePath := append(path[:len(path):len(path)], n)
		if d.rateLimit != nil {
			l, err := newLimit(d, domain, fullKey, nodePath)
			if err != nil {
				return err
			}
			n.limit = l
			b.cfg.limits = append(b.cfg.limits, l)
		}
		if d.shareThreshold && !n.wildcard {
			return fmt.Errorf("%s: share_threshold applies only to a wildcard value (ending in \"*\"), not to %q",
				place(d.shareAt, d.at), composite)
		}
		if n.wildcard {
			parent.wildcards = append(parent.wildcards, n)
		}
		parent.children[composite] = n
		if err := b.descriptors(n, domain, fullKey+".", nodePath, d.descriptors); err != nil {
			return err
		}
	}
	return nil
}
