package observe

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

var feedDigester = limiter.NewDigester([]byte("feed-test-secret"))

// testDenial is a denial of key from ip in zone at time at.
func testDenial(zone, key, ip string, at time.Time, logKey bool) *denialRequest {
	return &denialRequest{
		at: at, zone: zone, key: key, method: "GET", host: "api.example", path: "/v1/items",
		ip: netip.MustParseAddr(ip), logKey: logKey, digest: feedDigester,
	}
}

// TestDenialRing: the ring keeps the last feedRing denials, newest first,
// by zone when asked, up to a limit.
func TestDenialRing(t *testing.T) {
	t.Parallel()
	f := newDenialFeed(false)
	at := time.Unix(1_795_000_000, 0)
	if got := f.recent("", 10); len(got) != 0 {
		t.Fatalf("an empty ring lists %d denials", len(got))
	}
	for i := range feedRing + 50 {
		zone := "a"
		if i%2 == 1 {
			zone = "b"
		}
		f.record(testDenial(zone, "k"+strconv.Itoa(i), "192.0.2.1", at.Add(time.Duration(i)*time.Millisecond), false))
	}
	all := f.recent("", 1000)
	if len(all) != feedRing {
		t.Fatalf("%d denials, want the ring's %d", len(all), feedRing)
	}
	for i, d := range all {
		want := feedRing + 50 - 1 - i
		if d.KeyDigest != feedDigester.Digest("k"+strconv.Itoa(want)) {
			t.Fatalf("denial %d is not k%d's", i, want)
		}
	}
	b := f.recent("b", 3)
	if len(b) != 3 || b[0].Zone != "b" || b[2].Zone != "b" || b[0].KeyDigest != feedDigester.Digest("k249") {
		t.Errorf("zone b, limit 3: %+v", b)
	}
	if got := f.recent("none", 10); len(got) != 0 {
		t.Errorf("a zone without denials lists %d", len(got))
	}
}

// TestDenialThinning: of the denials of one millisecond the ring keeps the
// first feedPerMilli and counts the others thinned; the next millisecond
// is recorded again.
func TestDenialThinning(t *testing.T) {
	t.Parallel()
	f := newDenialFeed(false)
	at := time.Unix(1_795_000_000, 0)
	for i := range 10 {
		f.record(testDenial("z", "k"+strconv.Itoa(i), "192.0.2.1", at.Add(time.Duration(i)*time.Microsecond), false))
	}
	if got, thinned := len(f.recent("", 1000)), f.thinned.Load(); got != feedPerMilli || thinned != 10-feedPerMilli {
		t.Fatalf("10 denials in a millisecond: %d recorded, %d thinned; want %d and %d", got, thinned, feedPerMilli, 10-feedPerMilli)
	}
	f.record(testDenial("z", "next", "192.0.2.1", at.Add(time.Millisecond), false))
	if d := f.recent("", 1); len(d) != 1 || d[0].KeyDigest != feedDigester.Digest("next") {
		t.Fatalf("the next millisecond's denial: %+v, want it recorded", d)
	}
}

// TestDenialMasking: without log_key a denial shows the key's digest and
// the client's network, and its slot holds no more of the address; with
// log_key the key and the address as they are. Long fields are cut, a long
// key is digested whole.
func TestDenialMasking(t *testing.T) {
	t.Parallel()
	f := newDenialFeed(false)
	at := time.Now()
	f.record(testDenial("z", "sk_live_secret", "203.0.113.77", at, false))
	d := f.recent("", 1)[0]
	if d.Key != "" || d.KeyDigest != feedDigester.Digest("sk_live_secret") || d.ClientIP != "203.0.113.0/24" {
		t.Errorf("without log_key: %+v", d)
	}
	if slot := f.ring[0].ip; slot != netip.MustParseAddr("203.0.113.0") {
		t.Errorf("the ring keeps the address %s, want its network's", slot)
	}
	if d.Method != "GET" || d.Host != "api.example" || d.Path != "" || d.Node != nodeID || d.Zone != "z" || !d.Time.Equal(at) {
		t.Errorf("fields: %+v", d)
	}

	// Each denial in a millisecond of its own: none is thinned.
	f.record(testDenial("z", "2001:db8::/v6-key", "2001:db8:1:2:3:4:5:6", at.Add(time.Millisecond), false))
	if d := f.recent("", 1)[0]; d.ClientIP != "2001:db8:1:2::/64" || d.Key != "" {
		t.Errorf("IPv6 without log_key: %+v", d)
	}

	f.record(testDenial("z", "sk_live_secret", "203.0.113.77", at.Add(2*time.Millisecond), true))
	if d := f.recent("", 1)[0]; d.Key != "sk_live_secret" || d.ClientIP != "203.0.113.77" || d.Path != "/v1/items" || d.KeyDigest != feedDigester.Digest("sk_live_secret") {
		t.Errorf("with log_key: %+v", d)
	}

	long := testDenial("z", strings.Repeat("k", 1000), "198.51.100.1", at.Add(3*time.Millisecond), true)
	long.path = "/" + strings.Repeat("p", 1000)
	long.host = strings.Repeat("h", 1000)
	long.method = strings.Repeat("M", 100)
	f.record(long)
	d = f.recent("", 1)[0]
	if d.KeyDigest != feedDigester.Digest(long.key) {
		t.Error("a long key's digest is not the whole key's")
	}
	if len(d.Path) != feedPathRoom+len("…") || !strings.HasSuffix(d.Path, "…") || len(d.Host) != feedHostRoom+len("…") || len(d.Method) != feedMethodRoom+len("…") {
		t.Errorf("long fields not cut to their room: method %d, host %d, path %d bytes", len(d.Method), len(d.Host), len(d.Path))
	}

	var none denialRequest
	none.zone, none.digest, none.at = "z", feedDigester, at.Add(4*time.Millisecond)
	f.record(&none)
	if d := f.recent("", 1)[0]; d.ClientIP != "" {
		t.Errorf("no address: client_ip %q", d.ClientIP)
	}
}

// TestDenialSampling: a Redis store's feed queues the first feedSample
// denials of each second for the writer, and drops what does not fit the
// queue; the ring keeps them all.
func TestDenialSampling(t *testing.T) {
	t.Parallel()
	f := newDenialFeed(true)
	at := time.Unix(1_795_000_000, 0)
	for i := range 3 * feedSample {
		f.record(testDenial("z", "k", "192.0.2.1", at.Add(time.Duration(i)*time.Millisecond), false))
	}
	if n := len(f.queue); n != feedSample {
		t.Fatalf("%d denials queued in one second, want %d", n, feedSample)
	}
	// The next second samples again, until the queue is full.
	for i := range 3 * feedSample {
		f.record(testDenial("z", "k", "192.0.2.1", at.Add(time.Second+time.Duration(i)*time.Millisecond), false))
	}
	if n := len(f.queue); n != feedQueue {
		t.Fatalf("%d queued after two seconds, want %d", n, feedQueue)
	}
	for i := range 3 * feedSample {
		f.record(testDenial("z", "k", "192.0.2.1", at.Add(2*time.Second+time.Duration(i)*time.Millisecond), false))
	}
	if n, dropped := len(f.queue), f.dropped.Load(); n != feedQueue || dropped != feedSample {
		t.Errorf("third second: %d queued, %d dropped; want %d and %d", n, dropped, feedQueue, feedSample)
	}
	if got := len(f.recent("", 1000)); got != feedRing {
		t.Errorf("the ring lists %d, want %d", got, feedRing)
	}
	// The queue holds exports of the sample: the first of each second.
	first := <-f.queue
	if d := first.export(); !d.Time.Equal(at) || d.ClientIP != "192.0.2.0/24" {
		t.Errorf("first queued: %+v", d)
	}
}

// TestRecordDoesNotAllocate: recording a denial, and counting its
// network, allocate nothing once the network is in the sketch.
func TestRecordDoesNotAllocate(t *testing.T) {
	// Not parallel: AllocsPerRun counts every goroutine's allocations.
	f := newDenialFeed(true)
	nets := newTopKeys()
	req := testDenial("z", "sk_live_0123456789", "192.0.2.1", time.Now(), false)
	sec := req.at.Unix()
	allocs := testing.AllocsPerRun(1000, func() {
		f.record(req)
		if k, ok := keyOfNetwork(req.ip); ok {
			nets.addBytes(k.bytes(), sec)
		}
		select {
		case <-f.queue:
		default:
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per denial, want 0", allocs)
	}
}

// TestDecidedRecordsDenials drives Decided as the handler does: the
// zone's denial reaches the feed with the request's fields, a dry-run
// zone's would-be denial too, flagged, and the top networks count the
// denied one.
func TestDecidedRecordsDenials(t *testing.T) {
	t.Parallel()
	const zone = "unit_feed_decided"
	s := newTestStore(t, "unit_feed_decided")
	h := provision(t, zone, 1, s)
	r := httptest.NewRequest(http.MethodPost, "http://shop.example/cart?id=secret-query", nil)
	r.RemoteAddr = "198.51.100.23:5555"
	repl := caddy.NewReplacer()
	r = caddyhttp.PrepareRequest(r, repl, nil, nil)
	caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, "203.0.113.9")
	z := h.Zone(0)
	reqs := []limiter.Request{{Rule: z.rule, Key: "user-1", Cost: 1}}
	h.Decided(r, repl, limiter.Denied, []*Zone{z}, reqs, []limiter.Result{{Allowed: false}}, z.name)
	h.Decided(r, repl, limiter.Allowed, []*Zone{z}, reqs, []limiter.Result{{Allowed: true, DryRun: true}}, "")
	h.Decided(r, repl, limiter.Allowed, []*Zone{z}, reqs, []limiter.Result{{Allowed: true}}, "")
	h.Decided(r, repl, limiter.Denied, []*Zone{z}, reqs, []limiter.Result{{Banned: true}}, z.name)

	body := collectDenials(time.Now(), zone, 10, nil)
	if len(body.Denials) != 3 {
		t.Fatalf("%d denials, want 3: %+v", len(body.Denials), body.Denials)
	}
	banned, dry, denied := body.Denials[0], body.Denials[1], body.Denials[2]
	if !banned.Banned || banned.DryRun || !dry.DryRun || dry.Banned || denied.DryRun || denied.Banned {
		t.Errorf("flags (banned, dry_run): %v %v, %v %v, %v %v; want a ban, a dry run, a denial",
			banned.Banned, banned.DryRun, dry.Banned, dry.DryRun, denied.Banned, denied.DryRun)
	}
	// No path without log_key: a path can hold a client's secret.
	want := denialJSON{Zone: zone, KeyDigest: limiter.Digester{}.Digest("user-1"), Method: "POST", Host: "shop.example",
		ClientIP: "203.0.113.0/24", Node: nodeID}
	denied.Time = time.Time{}
	if denied != want {
		t.Errorf("denial %+v, want %+v", denied, want)
	}
	var src *storeSource
	for i := range body.Stores {
		if body.Stores[i].Name == s.name {
			src = &body.Stores[i]
		}
	}
	if src == nil || src.Source != "node" || src.Error != "" {
		t.Errorf("stores %+v: want %s's own feed", body.Stores, s.name)
	}

	zs := zoneEntries(zone)
	if len(zs) != 1 {
		t.Fatalf("entries of %s: %+v", zone, zs)
	}
	nets := zs[0].TopNetworks.Networks
	if len(nets) != 1 || nets[0].Network != "203.0.113.0/24" || nets[0].Denied != 2 {
		t.Errorf("top networks %+v, want 203.0.113.0/24 denied twice (the dry run is not a denial)", nets)
	}
}

// TestClientAddr: the client_ip variable first, the connection's peer
// without it; IPv4-mapped addresses are IPv4.
func TestClientAddr(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ clientIP, remote, want string }{
		{"203.0.113.9", "198.51.100.1:1", "203.0.113.9"},
		{"", "198.51.100.1:1", "198.51.100.1"},
		{"", "[::ffff:192.0.2.4]:80", "192.0.2.4"},
		{"", "[2001:db8::1]:80", "2001:db8::1"},
		{"", "@", ""},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = c.remote
		r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), nil, nil)
		if c.clientIP != "" {
			caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, c.clientIP)
		}
		got := clientAddr(r)
		if (c.want == "" && got.IsValid()) || (c.want != "" && got != netip.MustParseAddr(c.want)) {
			t.Errorf("client_ip %q, remote %q: %v, want %q", c.clientIP, c.remote, got, c.want)
		}
	}
}

// TestNetworkKeys: a network's sketch key reads back as the network.
func TestNetworkKeys(t *testing.T) {
	t.Parallel()
	for ip, want := range map[string]string{
		"192.0.2.200":            "192.0.2.0/24",
		"2001:db8:aa:bb:cc::1":   "2001:db8:aa:bb::/64",
		"::ffff:198.51.100.7":    "::/64", // unmapped by clientAddr before
		"2001:db8:aa:bb:ffff::9": "2001:db8:aa:bb::/64",
	} {
		k, ok := keyOfNetwork(netip.MustParseAddr(ip))
		if !ok {
			t.Fatalf("%s: no key", ip)
		}
		if got := networkOfKey(string(k.bytes())); got != want {
			t.Errorf("%s: %q, want %q", ip, got, want)
		}
		if n := network(netip.MustParseAddr(ip)).String(); n != want {
			t.Errorf("%s: network %q, want %q", ip, n, want)
		}
	}
	if _, ok := keyOfNetwork(netip.Addr{}); ok {
		t.Error("the zero address has a network key")
	}
	if networkOfKey("x") != "" {
		t.Error("a key of no network reads as one")
	}
}

// BenchmarkRecordDenial is the request path's cost of a denial: the feed's
// ring, the sample for Redis and the top networks, from every core at once.
func BenchmarkRecordDenial(b *testing.B) {
	f := newDenialFeed(true)
	nets := newTopKeys()
	go func() {
		for range f.queue {
		}
	}()
	b.Cleanup(func() { close(f.queue) })
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := testDenial("z", "sk_live_0123456789", "192.0.2.1", time.Now(), false)
		for pb.Next() {
			req.at = time.Now()
			f.record(req)
			if k, ok := keyOfNetwork(req.ip); ok {
				nets.addBytes(k.bytes(), req.at.Unix())
			}
		}
	})
}
