package config

import (
	"fmt"

	"gopkg.in/yaml.v3"
)

// referenceKeys are the keys that envoyproxy/ratelimit accepts. It checks
// them as one set, wherever they appear, and ignores one that means
// nothing where it is written; so does this package, with a warning.
var referenceKeys = map[string]bool{
	"domain": true, "descriptors": true, "key": true, "value": true,
	"rate_limit": true, "unit": true, "requests_per_unit": true, "unlimited": true,
	"name": true, "replaces": true, "shadow_mode": true, "quota_mode": true,
	"detailed_metric": true, "value_to_metric": true, "share_threshold": true,
	"metadata": true,
}

// extensionKeys are this package's keys beyond the reference's, all of
// them inside rate_limit.
var extensionKeys = map[string]bool{"algorithm": true, "burst": true, "zone": true}

// misplaced handles a key that the reader of where (a descriptor,
// rate_limit...) does not read: a key of the reference is ignored, as the
// reference ignores it, after its value passes the reference's check of
// keys; an extension outside rate_limit and any other key are refused.
func (r *yamlReader) misplaced(p yamlPair, where string, depth int) error {
	at := r.at(p.keyNode)
	switch {
	case referenceKeys[p.key]:
		r.warnings = append(r.warnings, fmt.Sprintf("%s: %s means nothing in %s and is ignored (as envoyproxy/ratelimit ignores it)", at, p.key, where))
		if p.key == "metadata" {
			return nil
		}
		return r.checkIgnored(p.value, depth)
	case extensionKeys[p.key]:
		return fmt.Errorf("%s: %s belongs inside rate_limit, not in %s", at, p.key, where)
	}
	return fmt.Errorf("%s: unknown key %q in %s", at, p.key, where)
}

// checkIgnored checks an ignored value's keys as the reference checks a
// whole file's: every key is one of its own, and lists hold mappings.
func (r *yamlReader) checkIgnored(n *yaml.Node, depth int) error {
	n, err := r.deref(n, depth)
	if err != nil {
		return err
	}
	switch n.Kind {
	case yaml.MappingNode:
		pairs, err := r.mapping(n, depth, "a mapping", true)
		if err != nil {
			return err
		}
		for _, p := range pairs {
			if !referenceKeys[p.key] && !extensionKeys[p.key] {
				return fmt.Errorf("%s: unknown key %q", r.at(p.keyNode), p.key)
			}
			if p.key == "metadata" {
				continue
			}
			if err := r.checkIgnored(p.value, depth+1); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		for _, e := range n.Content {
			e, err := r.deref(e, depth+1)
			if err != nil {
				return err
			}
			if e.Kind != yaml.MappingNode {
				return fmt.Errorf("%s: a list holds %s; lists hold mappings", r.at(e), describe(e))
			}
			if err := r.checkIgnored(e, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}
