package fleetlimit

import (
	"net/netip"
	"testing"
)

// TestParseExempt checks what an exempt list matches: addresses, networks
// (host bits dropped), IPv4-mapped forms and private_ranges.
func TestParseExempt(t *testing.T) {
	set, err := parseExempt([]string{"192.0.2.7", "10.1.2.3/8", "2001:db8::/32", "::ffff:198.51.100.0/120", "private_ranges"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ip   string
		want bool
	}{
		{"192.0.2.7", true},
		{"192.0.2.8", false},
		{"10.200.0.1", true},
		{"11.0.0.1", false},
		{"2001:db8:ffff::1", true},
		{"2001:db9::1", false},
		{"198.51.100.9", true},
		{"198.51.101.9", false},
		{"172.16.5.5", true}, // private_ranges
		{"127.0.0.2", true},  // private_ranges: loopback
		{"203.0.113.1", false},
	} {
		if got := set.contains(netip.MustParseAddr(c.ip)); got != c.want {
			t.Errorf("contains(%s) = %v, want %v", c.ip, got, c.want)
		}
	}
	for _, bad := range []string{"", "10.0.0.300", "10.0.0.0/33", "example.com", "fe80::1%eth0", "::ffff:0:0/90"} {
		if _, err := parseExempt([]string{bad}); err == nil {
			t.Errorf("parseExempt(%q) accepted it", bad)
		}
	}
}

// TestExemptAllocatesNothing checks the request path of an exempt client,
// and of a client an exempt list does not hold: neither allocates for the
// exemption.
func TestExemptAllocatesNothing(t *testing.T) {
	h := &Handler{}
	h.exempt, _ = parseExempt([]string{"203.0.113.0/24", "2001:db8::/32"})
	z := &Zone{}
	z.exempt, _ = parseExempt([]string{"192.0.2.7"})
	r, _ := benchRequest("k")
	allocs := testing.AllocsPerRun(1000, func() {
		ex := h.newExemption(r)
		if !ex.of(z) {
			t.Fatal("192.0.2.7 is not exempt from the zone")
		}
	})
	if allocs != 0 {
		t.Errorf("an exemption allocates %v times per request", allocs)
	}
}
