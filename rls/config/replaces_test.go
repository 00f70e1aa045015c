package config

import "testing"

func TestDropReplaced(t *testing.T) {
	cfg := load(t, "replaces.yaml")
	m := func(kv ...string) *Limit { return cfg.Match("gateway", ents(kv...)) }
	admin := m("kind", "admin")
	perBackend := m("account", "a1", "backend", "orders")
	edgeOrders := m("origin", "edge", "backend", "orders")
	ledger := m("origin", "edge", "backend", "ledger")
	blocked := m("account", "a1", "backend", "blocked")
	open := m("account", "a1", "backend", "open")
	for _, l := range []*Limit{admin, perBackend, edgeOrders, ledger, blocked, open} {
		if l == nil {
			t.Fatal("a descriptor of replaces.yaml matched nothing")
		}
	}
	if blocked.RequestsPerUnit != 0 || blocked.Unlimited {
		t.Errorf("a rule of 0 requests: %+v", blocked)
	}
	for _, c := range []struct {
		name string
		in   []*Limit
		want []*Limit
	}{
		{"nothing to replace", []*Limit{perBackend, nil, ledger}, []*Limit{perBackend, nil, ledger}},
		{"one replaces another", []*Limit{admin, perBackend}, []*Limit{admin, nil}},
		{"order does not matter", []*Limit{perBackend, edgeOrders}, []*Limit{nil, edgeOrders}},
		{"a name nobody has", []*Limit{admin, blocked}, []*Limit{admin, blocked}},
		{"unlimited replaces", []*Limit{ledger, open}, []*Limit{nil, open}},
		{"two replacers", []*Limit{admin, edgeOrders, perBackend}, []*Limit{admin, edgeOrders, nil}},
	} {
		got := append([]*Limit(nil), c.in...)
		DropReplaced(got)
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("%s: position %d is %v, want %v", c.name, i, got[i], c.want[i])
			}
		}
	}
}
