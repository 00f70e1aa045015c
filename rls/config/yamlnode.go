package config

import (
	"fmt"
	"strconv"

	"gopkg.in/yaml.v3"
)

// The YAML reader's walk over yaml.v3 nodes: aliases, mappings with merge
// keys, scalars read as the reference's YAML library reads them, and the
// bounds that keep a hostile file (aliases of aliases, deep nesting) from
// costing more than its size.

// maxDepth bounds the nesting of a file's nodes. A real configuration
// nests descriptors a few levels deep; each takes two (a list and a map).
const maxDepth = 128

// yamlReader reads one file. budget is how many more nodes it may visit,
// counting each alias as often as it is used.
type yamlReader struct {
	file     string
	budget   int
	warnings []string
}

// yamlPair is one key of a mapping and its value.
type yamlPair struct {
	key     string
	keyNode *yaml.Node
	value   *yaml.Node
}

// at places a node: "file:line".
func (r *yamlReader) at(n *yaml.Node) string { return r.file + ":" + strconv.Itoa(n.Line) }

// spend counts one visited node against the budget.
func (r *yamlReader) spend(n *yaml.Node) error {
	r.budget--
	if r.budget < 0 {
		return fmt.Errorf("%s: the document expands to too many nodes (aliases used too often)", r.at(n))
	}
	return nil
}

// deref follows aliases to the node they name and checks the depth.
func (r *yamlReader) deref(n *yaml.Node, depth int) (*yaml.Node, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("%s: nested more than %d levels deep", r.at(n), maxDepth)
	}
	for n.Kind == yaml.AliasNode {
		if err := r.spend(n); err != nil {
			return nil, err
		}
		if n.Alias == nil {
			return nil, fmt.Errorf("%s: alias %q names no anchor", r.at(n), n.Value)
		}
		n = n.Alias
	}
	return n, r.spend(n)
}

// mapping returns the pairs of a mapping, with those of its merge keys
// ("<<: *defaults") after its own, which take precedence as YAML's merge
// rule says. A key may appear once. strict requires string keys, as the
// reference requires of every key outside metadata.
func (r *yamlReader) mapping(n *yaml.Node, depth int, what string, strict bool) ([]yamlPair, error) {
	n, err := r.deref(n, depth)
	if err != nil {
		return nil, err
	}
	if n.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: %s must be a mapping, not %s", r.at(n), what, describe(n))
	}
	var own, merged []yamlPair
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, err := r.deref(n.Content[i], depth+1)
		if err != nil {
			return nil, err
		}
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			m, err := r.merge(n.Content[i+1], depth+1, what, strict)
			if err != nil {
				return nil, err
			}
			merged = append(merged, m...)
			continue
		}
		if k.Kind != yaml.ScalarNode || (strict && k.ShortTag() != "!!str") {
			return nil, fmt.Errorf("%s: key %s is not a string", r.at(k), describe(k))
		}
		own = append(own, yamlPair{key: k.Value, keyNode: k, value: n.Content[i+1]})
	}
	seen := make(map[string]*yaml.Node, len(own)+len(merged))
	for _, p := range own {
		if first := seen[p.key]; first != nil {
			return nil, fmt.Errorf("%s: key %q appears twice in one mapping (first at line %d)", r.at(p.keyNode), p.key, first.Line)
		}
		seen[p.key] = p.keyNode
	}
	for _, p := range merged {
		if seen[p.key] == nil {
			seen[p.key] = p.keyNode
			own = append(own, p)
		}
	}
	return own, nil
}

// merge returns the pairs that a merge key's value brings: one mapping or
// a list of them, the earlier taking precedence.
func (r *yamlReader) merge(v *yaml.Node, depth int, what string, strict bool) ([]yamlPair, error) {
	v, err := r.deref(v, depth)
	if err != nil {
		return nil, err
	}
	if v.Kind != yaml.SequenceNode {
		return r.mapping(v, depth, what, strict)
	}
	var pairs []yamlPair
	for _, e := range v.Content {
		m, err := r.mapping(e, depth+1, what, strict)
		if err != nil {
			return nil, err
		}
		pairs = append(pairs, m...)
	}
	return pairs, nil
}

// scalar returns the scalar a pair's value is, after aliases; nil for null.
func (r *yamlReader) scalar(p yamlPair, depth int, want string) (*yaml.Node, error) {
	n, err := r.deref(p.value, depth)
	if err != nil {
		return nil, err
	}
	if n.Kind != yaml.ScalarNode {
		return nil, fmt.Errorf("%s: %s must be %s, not %s", r.at(p.keyNode), p.key, want, describe(n))
	}
	if n.ShortTag() == "!!null" {
		return nil, nil
	}
	return n, nil
}

// str reads a string as the reference does: any scalar is its text (value:
// 100 is "100"), and null is empty.
func (r *yamlReader) str(p yamlPair, depth int) (string, error) {
	n, err := r.scalar(p, depth, "a string")
	if n == nil || err != nil {
		return "", err
	}
	return n.Value, nil
}

// yaml11Bools are the plain words that the reference's YAML library (YAML
// 1.1) reads as booleans.
var yaml11Bools = map[string]bool{
	"true": true, "True": true, "TRUE": true, "false": false, "False": false, "FALSE": false,
	"yes": true, "Yes": true, "YES": true, "no": false, "No": false, "NO": false,
	"on": true, "On": true, "ON": true, "off": false, "Off": false, "OFF": false,
	"y": true, "Y": true, "n": false, "N": false,
}

// boolean reads a boolean: a plain YAML 1.1 boolean word, or null (false).
func (r *yamlReader) boolean(p yamlPair, depth int) (bool, error) {
	n, err := r.scalar(p, depth, "true or false")
	if n == nil || err != nil {
		return false, err
	}
	if b, ok := yaml11Bools[n.Value]; ok && (n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) == 0 || n.ShortTag() == "!!bool") {
		return b, nil
	}
	return false, fmt.Errorf("%s: %s must be true or false, not %s", r.at(p.keyNode), p.key, describe(n))
}

// integer reads a whole number from lo to hi; null is 0.
func (r *yamlReader) integer(p yamlPair, depth int, lo, hi int64) (int64, error) {
	n, err := r.scalar(p, depth, "a whole number")
	if n == nil || err != nil {
		return 0, err
	}
	var v int64
	if n.ShortTag() != "!!int" || n.Decode(&v) != nil || v < lo || v > hi {
		return 0, fmt.Errorf("%s: %s must be a whole number from %d to %d, not %s", r.at(p.keyNode), p.key, lo, hi, describe(n))
	}
	return v, nil
}

// describe names a node for an error: a scalar by its text (bounded), a
// collection by its kind.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		v := n.Value
		if len(v) > 40 {
			v = v[:40] + "..."
		}
		return strconv.Quote(v)
	}
	return "an empty document"
}
