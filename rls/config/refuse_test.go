package config

import (
	"strings"
	"testing"
)

// refuseCase is a file that Load must refuse, and what the error must say:
// its place (file:line) and a phrase.
type refuseCase struct {
	name   string
	yaml   string
	at     string
	phrase string
}

func runRefusals(t *testing.T, cases []refuseCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Load([]File{{Name: "f.yaml", Data: []byte(c.yaml)}})
			if err == nil {
				t.Fatalf("loaded (%d rules), want an error at %s saying %q", len(cfg.Limits()), c.at, c.phrase)
			}
			msg := err.Error()
			at := c.at
			if !strings.HasSuffix(at, ":") {
				at += ": "
			}
			if !strings.HasPrefix(msg, at) || !strings.Contains(msg, c.phrase) {
				t.Errorf("error %q, want it at %s saying %q", msg, c.at, c.phrase)
			}
		})
	}
}

// The reference's own refusals, each with the place of the mistake.
func TestRefuseReferenceRules(t *testing.T) {
	runRefusals(t, []refuseCase{
		{"bad yaml", "'''\n", "f.yaml", "yaml: line"},
		{"empty file", "", "f.yaml:1", "domain is empty"},
		{"no domain", "descriptors:\n  - key: a\n", "f.yaml:1", "domain is empty"},
		{"empty domain", "domain: ''\n", "f.yaml:1", "domain is empty"},
		{"top level is a list", "- domain: a\n", "f.yaml:1", "must be a mapping"},
		{"misspelled rate_limit", "domain: d\ndescriptors:\n  - key: k\n    ratelimit:\n      unit: day\n", "f.yaml:4", `unknown key "ratelimit"`},
		{"misspelled requests_per_unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n", "f.yaml:6", `unknown key "requestsperunit"`},
		{"non-string key", "0.25: d\ndescriptors:\n", "f.yaml:1", `key "0.25" is not a string`},
		{"boolean key", "domain: d\ndescriptors:\n  - true: k\n", "f.yaml:3", "is not a string"},
		{"list of scalars", "domain: d\ndescriptors:\n  - a\n  - b\n", "f.yaml:3", `descriptors holds "a"`},
		{"descriptors not a list", "domain: d\ndescriptors: {key: a}\n", "f.yaml:2", "must be a list"},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n", "f.yaml:3", "empty key"},
		{"duplicate descriptor", "domain: d\ndescriptors:\n  - key: k\n    value: v\n\n  - key: k\n    value: v\n", "f.yaml:6", `duplicate descriptor "d.k_v" (first defined at f.yaml:3)`},
		{"duplicate nested", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n      - key: b\n", "f.yaml:6", `duplicate descriptor "d.a.b"`},
		{"bad unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n", "f.yaml:5", `invalid rate limit unit "fortnight"`},
		{"unknown unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: unknown\n", "f.yaml:5", "invalid rate limit unit"},
		{"no unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 5\n", "f.yaml:4", "needs a unit"},
		{"empty rate_limit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {}\n", "f.yaml:4", "needs a unit"},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n", "f.yaml:6", "an unlimited rule takes no unit"},
		{"replaces empty", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: me\n      unit: second\n      replaces:\n        - name:\n", "f.yaml:8", "needs a name"},
		{"replaces self", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: me\n      unit: second\n      replaces:\n        - name: other\n        - name: me\n", "f.yaml:9", `cannot replace itself ("me")`},
		{"replaces not a list", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      replaces: me\n", "f.yaml:6", "must be a list"},
		{"replaces of names", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      replaces: [me]\n", "f.yaml:6", `replaces holds "me"`},
		{"share_threshold without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n", "f.yaml:5", `wildcard value (ending in "*"), not to "k_v"`},
		{"share_threshold with inner star", "domain: d\ndescriptors:\n  - key: k\n    value: a*b\n    share_threshold: true\n", "f.yaml:5", "wildcard value"},
	})
}

// Values of the wrong type, which the reference's YAML library refuses too.
func TestRefuseValues(t *testing.T) {
	rl := func(line string) string {
		return "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      " + line + "\n"
	}
	runRefusals(t, []refuseCase{
		{"negative requests", rl("requests_per_unit: -1"), "f.yaml:6", "from 0 to 4294967295"},
		{"huge requests", rl("requests_per_unit: 4294967296"), "f.yaml:6", "from 0 to 4294967295"},
		{"fractional requests", rl("requests_per_unit: 2.5"), "f.yaml:6", "whole number"},
		{"quoted requests", rl(`requests_per_unit: "5"`), "f.yaml:6", "whole number"},
		{"requests as a list", rl("requests_per_unit: [5]"), "f.yaml:6", "must be a whole number, not a list"},
		{"quoted boolean", rl(`unlimited: "true"`), "f.yaml:6", "true or false"},
		{"word for a boolean", rl("unlimited: sure"), "f.yaml:6", "true or false"},
		{"unit as a mapping", rl("name: {a: b}"), "f.yaml:6", "name must be a string, not a mapping"},
		{"rate_limit as a list", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: [1]\n", "f.yaml:4", "rate_limit must be a mapping"},
		{"key repeated in a mapping", "domain: d\ndescriptors:\n  - key: k\n    key: j\n", "f.yaml:4", `key "key" appears twice in one mapping (first at line 3)`},
		{"metadata not a mapping", "domain: d\ndescriptors:\n  - key: k\n    metadata: [1]\n", "f.yaml:4", "metadata must be a mapping"},
	})
}

// YAML that would cost more than its size, and nesting beyond reason.
func TestRefuseHostileYAML(t *testing.T) {
	// Each anchor is a list of eight aliases of the one before: 8^12
	// nodes if they were all visited.
	bomb := "domain: d\ndescriptors:\n  - key: k\n    metadata:\n      a: &a [x, x, x, x, x, x, x, x]\n"
	prev := "a"
	for i := range 12 {
		name := string(rune('b' + i))
		bomb += "      " + name + ": &" + name + " [" + strings.Repeat("*"+prev+", ", 7) + "*" + prev + "]\n"
		prev = name
	}
	deep := "domain: d\ndescriptors:\n"
	indent := ""
	for range 100 {
		deep += indent + "  - key: k\n" + indent + "    descriptors:\n"
		indent += "    "
	}
	runRefusals(t, []refuseCase{
		{"alias bomb", bomb, "f.yaml:", "too many nodes"},
		{"nesting", deep, "f.yaml:", "nested more than 128 levels"},
		{"recursive alias", "domain: d\ndescriptors: &l\n  - key: k\n    descriptors: *l\n", "f.yaml:", "nested more than"},
	})
}

func TestRefuseDuplicateDomain(t *testing.T) {
	_, err := Load([]File{
		{Name: "one.yaml", Data: []byte("domain: shared\n")},
		{Name: "two.yaml", Data: []byte("# the same domain again\ndomain: shared\n")},
	})
	if err == nil || err.Error() != `two.yaml:2: duplicate domain "shared" (first defined at one.yaml:1)` {
		t.Errorf("error %v", err)
	}
}
