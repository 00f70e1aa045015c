package config

import (
	"fmt"

	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"
)

// metadata reads a descriptor's metadata: any mapping, whose keys may be
// any scalar (read as text) and whose values are kept as a protobuf Struct,
// ready for a response's dynamic metadata. Null or an empty mapping is
// none.
func (r *yamlReader) metadata(p yamlPair, depth int) (*structpb.Struct, error) {
	n, err := r.deref(p.value, depth)
	if err != nil || n.ShortTag() == "!!null" {
		return nil, err
	}
	if n.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: metadata must be a mapping, not %s", r.at(p.keyNode), describe(n))
	}
	v, err := r.anyValue(n, depth)
	if err != nil {
		return nil, err
	}
	m := v.(map[string]any)
	if len(m) == 0 {
		return nil, nil
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		return nil, fmt.Errorf("%s: metadata: %w", r.at(p.keyNode), err)
	}
	return s, nil
}

// anyValue converts a node to the values a Struct holds: maps, lists,
// strings, numbers, booleans and nil. Timestamps and other tagged scalars
// stay text, as the reference's YAML library leaves them.
func (r *yamlReader) anyValue(n *yaml.Node, depth int) (any, error) {
	n, err := r.deref(n, depth)
	if err != nil {
		return nil, err
	}
	switch n.Kind {
	case yaml.MappingNode:
		pairs, err := r.mapping(n, depth, "metadata", false)
		if err != nil {
			return nil, err
		}
		m := make(map[string]any, len(pairs))
		for _, p := range pairs {
			if m[p.key], err = r.anyValue(p.value, depth+1); err != nil {
				return nil, err
			}
		}
		return m, nil
	case yaml.SequenceNode:
		s := make([]any, len(n.Content))
		for i, e := range n.Content {
			if s[i], err = r.anyValue(e, depth+1); err != nil {
				return nil, err
			}
		}
		return s, nil
	}
	switch n.ShortTag() {
	case "!!null":
		return nil, nil
	case "!!bool", "!!int", "!!float":
		var v any
		if err := n.Decode(&v); err != nil {
			return nil, fmt.Errorf("%s: metadata: %w", r.at(n), err)
		}
		return v, nil
	}
	return n.Value, nil
}
