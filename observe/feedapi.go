package observe

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"time"
)

// GET /rate_limit/denials: the denial feed. For each Redis store, the
// fleet's denials, read from the zones' streams (denialFeed samples them); for
// the memory store, and for a Redis store that cannot be read, this node's
// own. All of them merged, newest first.

const (
	// feedDefaultLimit is how many denials the feed lists unless asked.
	feedDefaultLimit = 50
	// feedReadCache is how long a read of a store's streams is reused, so
	// that several open dashboards cost Redis one read a second.
	feedReadCache = 900 * time.Millisecond
)

// denialsBody is the body of GET /rate_limit/denials.
type denialsBody struct {
	// Node is this node's id (host name/process id).
	Node string `json:"node"`
	// Time is when the feed was read.
	Time time.Time `json:"time"`
	// Stores say where the denials of each store come from.
	Stores []storeSource `json:"stores"`
	// Denials are the newest denials, newest first.
	Denials []denialJSON `json:"denials"`
}

// denialJSON is one denial. Key and Path are there only when the node
// that denied the request has log_key; ClientIP is then the client's
// address, else its network (/24 or /64). Route is what the zone's
// matchers match (absent when it has none).
type denialJSON struct {
	Time      time.Time `json:"time"`
	Zone      string    `json:"zone"`
	KeyDigest string    `json:"key_digest"`
	Key       string    `json:"key,omitempty"`
	Method    string    `json:"method"`
	Host      string    `json:"host"`
	Path      string    `json:"path,omitempty"`
	Route     string    `json:"route,omitempty"`
	ClientIP  string    `json:"client_ip"`
	Node      string    `json:"node"`
	Banned    bool      `json:"banned"`
	DryRun    bool      `json:"dry_run"`
}

func denialOf(d *Denial) denialJSON {
	return denialJSON{
		Time: d.Time, Zone: d.Zone, KeyDigest: d.KeyDigest, Key: d.Key,
		Method: d.Method, Host: d.Host, Path: d.Path, Route: d.Route, ClientIP: d.ClientIP,
		Node: d.Node, Banned: d.Banned, DryRun: d.DryRun,
	}
}

// readFeed returns the store's fleet denials of zones: a read younger than
// feedReadCache, else what Redis answers by deadline, else the last read,
// stale.
func (s *storeStats) readFeed(zones []string, limit int, deadline time.Time) reading[[]Denial] {
	return s.feedRead.get(s.ctx, fmt.Sprint(zones, limit), feedReadCache, deadline, feedTimeout, func(ctx context.Context) ([]Denial, error) {
		return s.shared.readDenials(ctx, zones, limit)
	})
}

// collectDenials gathers the feed of every store in the process (of those
// of the zones in scope with a scope): up to limit denials of the zone
// named (of every zone in scope if zone is ""), newest first. A Redis
// store's streams are waited for until its timeout after now; then its
// last read is listed, stale, or else this node's own denials.
func collectDenials(now time.Time, zone string, limit int, in scope) *denialsBody {
	out := &denialsBody{Node: nodeID, Time: now, Stores: []storeSource{}, Denials: []denialJSON{}}
	zonesOf := map[*storeStats][]string{}
	zoneRegistry.Range(func(_, v any) bool {
		z := v.(*zoneStats)
		if !z.dead.Load() && (zone == "" || z.name == zone) && in.has(z) {
			zonesOf[z.store] = append(zonesOf[z.store], z.name)
		}
		return true
	})
	var stores []*storeStats
	storeRegistry.Range(func(_, v any) bool {
		if s := v.(*storeStats); in == nil || len(zonesOf[s]) > 0 {
			stores = append(stores, s)
		}
		return true
	})
	sort.Slice(stores, func(i, j int) bool { return stores[i].name < stores[j].name })
	var all []Denial
	for _, s := range stores {
		src := storeSource{Name: s.name, Source: "node"}
		if s.redis != nil {
			names := zonesOf[s]
			sort.Strings(names)
			r := s.readFeed(names, limit, s.readDeadline(now))
			src.read(r.at, r.stale, r.err)
			if r.ok {
				src.Source = "fleet"
				all = append(all, r.val...)
				out.Stores = append(out.Stores, src)
				continue
			}
		}
		if in == nil {
			all = append(all, s.feed.recent(zone, limit)...)
		} else {
			all = append(all, s.feed.recentOf(zonesOf[s], limit)...)
		}
		out.Stores = append(out.Stores, src)
	}
	// Each store's denials are newest first already: merged by time.
	sort.SliceStable(all, func(i, j int) bool { return all[i].Time.After(all[j].Time) })
	for i := range all[:min(len(all), limit)] {
		out.Denials = append(out.Denials, denialOf(&all[i]))
	}
	return out
}

// serveDenials answers GET /rate_limit/denials?zone=NAME&limit=N (limit 1
// to DenialStreamLength, default feedDefaultLimit).
func serveDenials(w http.ResponseWriter, r *http.Request, in scope) (int, error) {
	limit, err := intParam(r, "limit", feedDefaultLimit, 1, DenialStreamLength, "denials")
	if err != nil {
		return http.StatusBadRequest, err
	}
	return answerJSON(w, r, collectDenials(time.Now(), r.URL.Query().Get("zone"), limit, in))
}
