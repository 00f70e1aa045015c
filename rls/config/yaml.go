package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"

	"gopkg.in/yaml.v3"
)

// readYAML reads one file of the reference's format into its raw domain,
// with the warnings it gives. Only the file's first YAML document counts,
// as in the reference.
func readYAML(file string, data []byte) (*rawDomain, []string, error) {
	r := &yamlReader{file: file, budget: 4096 + 16*len(data)}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, fmt.Errorf("%s: %w", file, err)
	}
	var next yaml.Node
	if err := dec.Decode(&next); err == nil {
		r.warnings = append(r.warnings, fmt.Sprintf("%s: only the file's first YAML document is read; the one at line %d is ignored, as envoyproxy/ratelimit ignores it", file, next.Line))
	}
	if len(doc.Content) == 0 || doc.Content[0].ShortTag() == "!!null" {
		return &rawDomain{at: file + ":1"}, r.warnings, nil
	}
	d, err := r.domain(doc.Content[0])
	if err != nil {
		return nil, nil, err
	}
	return d, r.warnings, nil
}

// domain reads the top level: domain and descriptors.
func (r *yamlReader) domain(root *yaml.Node) (*rawDomain, error) {
	pairs, err := r.mapping(root, 0, "the top level (domain and descriptors)", true)
	if err != nil {
		return nil, err
	}
	d := &rawDomain{at: r.at(root)}
	for _, p := range pairs {
		switch p.key {
		case "domain":
			d.at = r.at(p.keyNode)
			d.domain, err = r.str(p, 1)
		case "descriptors":
			d.descriptors, err = r.descriptors(p, 1)
		default:
			err = r.misplaced(p, "the top level", 1)
		}
		if err != nil {
			return nil, err
		}
	}
	return d, nil
}

// descriptors reads a list of descriptors; null is none.
func (r *yamlReader) descriptors(p yamlPair, depth int) ([]rawDescriptor, error) {
	list, err := r.list(p, depth)
	if len(list) == 0 || err != nil {
		return nil, err
	}
	ds := make([]rawDescriptor, len(list))
	for i, e := range list {
		if ds[i], err = r.descriptor(e, depth+1); err != nil {
			return nil, err
		}
	}
	return ds, nil
}

// descriptor reads one descriptor.
func (r *yamlReader) descriptor(n *yaml.Node, depth int) (rawDescriptor, error) {
	d := rawDescriptor{at: r.at(n)}
	pairs, err := r.mapping(n, depth, "a descriptor", true)
	if err != nil {
		return d, err
	}
	for _, p := range pairs {
		switch p.key {
		case "key":
			d.key, err = r.str(p, depth+1)
		case "value":
			d.value, err = r.str(p, depth+1)
		case "rate_limit":
			d.rateLimit, err = r.rateLimit(p, depth+1)
		case "descriptors":
			d.descriptors, err = r.descriptors(p, depth+1)
		case "shadow_mode":
			d.shadowMode, err = r.boolean(p, depth+1)
		case "quota_mode":
			d.quotaMode, err = r.boolean(p, depth+1)
		case "detailed_metric":
			d.detailedMetric, err = r.boolean(p, depth+1)
		case "value_to_metric":
			d.valueToMetric, err = r.boolean(p, depth+1)
		case "share_threshold":
			d.shareAt = r.at(p.keyNode)
			d.shareThreshold, err = r.boolean(p, depth+1)
		case "metadata":
			d.metadata, err = r.metadata(p, depth+1)
		default:
			err = r.misplaced(p, "a descriptor", depth+1)
		}
		if err != nil {
			return d, err
		}
	}
	return d, nil
}

// rateLimit reads a descriptor's rate_limit, extensions included; null is
// none, as in the reference.
func (r *yamlReader) rateLimit(p yamlPair, depth int) (*rawRateLimit, error) {
	if n, err := r.deref(p.value, depth); err != nil || n.ShortTag() == "!!null" {
		return nil, err
	}
	pairs, err := r.mapping(p.value, depth, "rate_limit", true)
	if err != nil {
		return nil, err
	}
	rl := &rawRateLimit{at: r.at(p.keyNode)}
	for _, q := range pairs {
		at := r.at(q.keyNode)
		var v int64
		switch q.key {
		case "unit":
			rl.hasUnit, rl.unitAt = true, at
			rl.unit, err = r.str(q, depth+1)
		case "requests_per_unit":
			v, err = r.integer(q, depth+1, 0, math.MaxUint32)
			rl.requestsPerUnit, rl.hasRequests = uint32(v), true
		case "unlimited":
			rl.unlimitedAt = at
			rl.unlimited, err = r.boolean(q, depth+1)
		case "name":
			rl.name, err = r.str(q, depth+1)
		case "replaces":
			rl.replaces, err = r.replaces(q, depth+1)
		case "algorithm":
			rl.hasAlgorithm, rl.algorithmAt = true, at
			rl.algorithm, err = r.str(q, depth+1)
		case "burst":
			rl.burst, err = r.integer(q, depth+1, math.MinInt64, math.MaxInt64)
			rl.hasBurst, rl.burstAt = true, at
		case "zone":
			rl.hasZone, rl.zoneAt = true, at
			rl.zone, err = r.str(q, depth+1)
		default:
			err = r.misplaced(q, "rate_limit", depth+1)
		}
		if err != nil {
			return nil, err
		}
	}
	return rl, nil
}

// replaces reads a rate_limit's replaces: a list of {name}.
func (r *yamlReader) replaces(p yamlPair, depth int) ([]rawReplace, error) {
	list, err := r.list(p, depth)
	if len(list) == 0 || err != nil {
		return nil, err
	}
	out := make([]rawReplace, len(list))
	for i, e := range list {
		out[i].at = r.at(e)
		pairs, err := r.mapping(e, depth+1, "a replaces entry", true)
		if err != nil {
			return nil, err
		}
		for _, q := range pairs {
			if q.key == "name" {
				out[i].name, err = r.str(q, depth+2)
			} else {
				err = r.misplaced(q, "a replaces entry", depth+2)
			}
			if err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// list returns the items of a list of mappings; null is an empty list.
func (r *yamlReader) list(p yamlPair, depth int) ([]*yaml.Node, error) {
	n, err := r.deref(p.value, depth)
	switch {
	case err != nil:
		return nil, err
	case n.ShortTag() == "!!null":
		return nil, nil
	case n.Kind != yaml.SequenceNode:
		return nil, fmt.Errorf("%s: %s must be a list, not %s", r.at(p.keyNode), p.key, describe(n))
	}
	items := make([]*yaml.Node, len(n.Content))
	for i, e := range n.Content {
		if items[i], err = r.deref(e, depth+1); err != nil {
			return nil, err
		}
		if items[i].Kind != yaml.MappingNode {
			return nil, fmt.Errorf("%s: %s holds %s; it holds mappings", r.at(items[i]), p.key, describe(items[i]))
		}
	}
	return items, nil
}
