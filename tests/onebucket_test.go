package tests

import (
	"fmt"
	"testing"
)

// TestOneClientOneBucket sends, as the attacker, another client's address
// in the header that the zone's first key alternative reads: the attacker's
// requests must spend a bucket of their own, never the address's, and a
// ban they earn must not ban the address. The same holds for the sidecar's
// form, where the address comes from a header too.
func TestOneClientOneBucket(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		key    string
		victim []string // the headers of the victim's requests
	}{
		{"client_ip", "{header.X-API-Key} {client_ip}", nil},
		{"sidecar", "{header.X-API-Key} {header.X-Real-IP}", []string{"X-Real-IP: 127.0.0.1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			stores(t, func(t *testing.T, redis string) {
				n := startCaddy(t, "", fmt.Sprintf(`
	rate_limit {
		%s
		zone api {
			key %s
			rate 3 1h
			match {
				not path /login
			}
		}
		zone guard {
			key %s
			rate 2 1h
			ban 1h after 1 in 1h
			match {
				path /login
			}
		}
	}
	respond "ok"
	handle_errors {
		respond "{err.message}" {err.status_code}
	}`, redis, c.key, c.key))

				attack := append([]string{"X-API-Key: 127.0.0.1"}, c.victim...)
				var got []int
				for range 4 {
					got = append(got, n.get("/", attack...).Status)
				}
				if fmt.Sprint(got) != "[200 200 200 429]" {
					t.Fatalf("the attacker's own bucket of 3: got %v", got)
				}
				if r := n.get("/", c.victim...); r.Status != 200 {
					t.Fatalf("the victim 127.0.0.1 after the attack: status %d, want 200 (its bucket was spent by a header)", r.Status)
				}

				// A ban at the first denial: the attacker bans itself, not
				// the address it names.
				for range 2 {
					n.get("/login", attack...)
				}
				if r := n.get("/login", attack...); !banned(r) {
					t.Fatalf("the attacker was not banned: status %d %q", r.Status, r.Body)
				}
				if r := n.get("/login", c.victim...); r.Status != 200 {
					t.Fatalf("the victim 127.0.0.1 after the attacker's ban: status %d %q, want 200", r.Status, r.Body)
				}
			})
		})
	}
}
