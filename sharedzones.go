package fleetlimit

import (
	"fmt"
	"slices"
	"sync"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// SharedZone is a rate_limit zone as another module (the Envoy rate limit
// service) spends its buckets: the zone's rule, the store its buckets live
// in, and the bucket key of a client's value.
type SharedZone struct {
	// Rule is the zone's compiled rule.
	Rule *limiter.Rule
	// Store is the store of the handler that has the zone.
	Store limiter.Store
	// Key returns the bucket key of a value of the zone's first key
	// expression ({client_ip}, say): grouped into its network when the
	// zone groups addresses, bounded, in that expression's namespace.
	Key func(value string) string
}

// sharedZones are the zones of the handlers provisioned and not yet cleaned
// up, by name, the latest provisioned last: across a reload the new
// configuration's zones are found while the old one still runs. Zones are
// process-wide by nature here: another app looks them up by name.
var sharedZones = struct {
	mu sync.Mutex
	m  map[string][]sharedZone
}{m: make(map[string][]sharedZone)}

// sharedZone is one handler's zone, or why it cannot be shared.
type sharedZone struct {
	owner *Handler
	zone  SharedZone
	err   error
}

// LookupZone returns the zone named name of the rate_limit handler
// provisioned last (and not cleaned up), or an error saying why there is
// none to share: no such zone, or one whose decisions need the HTTP
// request (placeholder rates, a leaky bucket's or soft shedding's delay,
// concurrency slots released when a response ends).
func LookupZone(name string) (SharedZone, error) {
	sharedZones.mu.Lock()
	defer sharedZones.mu.Unlock()
	zs := sharedZones.m[name]
	if len(zs) == 0 {
		return SharedZone{}, fmt.Errorf("no rate_limit zone %q in this configuration", name)
	}
	z := zs[len(zs)-1]
	return z.zone, z.err
}

// publishZones makes the handler's zones known to LookupZone.
func (h *Handler) publishZones() {
	sharedZones.mu.Lock()
	defer sharedZones.mu.Unlock()
	for _, z := range h.Zones {
		sharedZones.m[z.Name] = append(sharedZones.m[z.Name], sharedZone{owner: h, zone: SharedZone{
			Rule: z.rule, Store: h.limiter.Store(), Key: func(v string) string { return z.normalKey(0, v) },
		}, err: z.unshareable()})
	}
}

// withdrawZones forgets the handler's zones.
func (h *Handler) withdrawZones() {
	sharedZones.mu.Lock()
	defer sharedZones.mu.Unlock()
	for _, z := range h.Zones {
		if z == nil { // a JSON null zone, refused by Provision
			continue
		}
		left := slices.DeleteFunc(sharedZones.m[z.Name], func(s sharedZone) bool { return s.owner == h })
		if len(left) == 0 {
			delete(sharedZones.m, z.Name)
		} else {
			sharedZones.m[z.Name] = left
		}
	}
}

// unshareable says why the zone's buckets cannot be spent without an HTTP
// request, nil when they can.
func (z *Zone) unshareable() error {
	switch {
	case z.rules != nil:
		return fmt.Errorf("rate_limit zone %q takes its rate from placeholders of the HTTP request", z.Name)
	case z.rule.Algorithm() == limiter.LeakyBucket || z.SoftShed > 0:
		return fmt.Errorf("rate_limit zone %q delays requests (leaky_bucket or soft_shed), which a rate limit service cannot", z.Name)
	case z.rule.Algorithm() == limiter.Concurrency:
		return fmt.Errorf("rate_limit zone %q holds a slot until the response ends, which a rate limit service never learns", z.Name)
	}
	return nil
}
