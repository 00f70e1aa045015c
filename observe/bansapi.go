package observe

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// The bans API: GET /rate_limit/bans lists the bans of repeat offenders as
// the stores' registries list them (limiter.BanKeeper), and DELETE lifts one
// across the fleet, by its key or its digest (docs/design.md, "The bans
// API").

const (
	// bansDefaultLimit is how many bans per zone and store the list shows
	// unless asked.
	bansDefaultLimit = 100
	// maxLiftTarget bounds the key or digest of a lift.
	maxLiftTarget = 256
)

// bansBody is the body of GET /rate_limit/bans.
type bansBody struct {
	// Node is this node's id (host name/process id).
	Node string `json:"node"`
	// Time is when the bans were listed.
	Time time.Time `json:"time"`
	// Stores are the stores whose registries were read, each with the
	// error that kept its bans from the list, if any.
	Stores []storeSource `json:"stores"`
	// Bans are the bans in force, those that end last first.
	Bans []banJSON `json:"bans"`
}

// banJSON is one ban. Key is there only when the handler of its zone has
// log_key. Start and End are RFC 3339, by the store's clock; SecondsLeft is
// rounded up, like Retry-After.
type banJSON struct {
	Zone        string    `json:"zone"`
	Store       string    `json:"store"`
	KeyDigest   string    `json:"key_digest"`
	Key         string    `json:"key,omitempty"`
	Start       time.Time `json:"start"`
	End         time.Time `json:"end"`
	SecondsLeft int64     `json:"seconds_left"`
	Denials     int64     `json:"denials"`
}

// liftBody is the body of a DELETE that lifted a ban: what it lifted (one
// ban per store holding a zone of that name), and an error when a store
// could not tell every node (their deny caches may answer the ban until
// it ends).
type liftBody struct {
	Lifted []banJSON `json:"lifted"`
	Error  string    `json:"error,omitempty"`
}

// banZone is a zone whose bans can be listed and lifted: its stats, its
// store's registry and what its handler shows of keys.
type banZone struct {
	stats  *zoneStats
	keeper limiter.BanKeeper
	info   *zoneInfo
}

// banZones returns, by store, the live zones in scope in named zone (""
// for every zone) on stores that keep bans.
func banZones(zone string, in scope) map[*storeStats][]banZone {
	out := map[*storeStats][]banZone{}
	zoneRegistry.Range(func(_, v any) bool {
		z := v.(*zoneStats)
		if z.dead.Load() || (zone != "" && z.name != zone) || !in.has(z) {
			return true
		}
		info := z.info.Load()
		keeper := z.store.banKeeper()
		if info == nil || keeper == nil {
			return true
		}
		out[z.store] = append(out[z.store], banZone{stats: z, keeper: keeper, info: info})
		return true
	})
	return out
}

// banKeeper returns the store's ban registry, or nil.
func (s *storeStats) banKeeper() limiter.BanKeeper {
	switch {
	case s.redis != nil:
		return s.redis
	case s.memory != nil:
		return s.memory
	}
	return nil
}

// sortedStores returns the keys of m by store name.
func sortedStores(m map[*storeStats][]banZone) []*storeStats {
	stores := make([]*storeStats, 0, len(m))
	for s := range m {
		stores = append(stores, s)
	}
	sort.Slice(stores, func(i, j int) bool { return stores[i].name < stores[j].name })
	return stores
}

// banOf is the JSON of a ban of zone z on store s.
func banOf(s *storeStats, z *banZone, b *limiter.BanRecord) banJSON {
	j := banJSON{
		Zone: b.Zone, Store: s.name, KeyDigest: z.info.digest.Digest(b.Key),
		Start: b.Start, End: b.End, SecondsLeft: retryAfterSeconds(b.Left), Denials: b.Denials,
	}
	if z.info.logKey {
		j.Key = b.Key
	}
	return j
}

// collectBans lists the bans in force of the zone named (of every zone in
// scope if zone is ""), at most limit per zone and store. A Redis store's
// registry is waited for until its timeout after now; then its last read
// is listed, stale, less the bans that have ended since.
func collectBans(ctx context.Context, now time.Time, zone string, limit int, in scope) *bansBody {
	out := &bansBody{Node: nodeID, Time: now, Stores: []storeSource{}, Bans: []banJSON{}}
	byStore := banZones(zone, in)
	for _, s := range sortedStores(byStore) {
		zones := byStore[s]
		sort.Slice(zones, func(i, j int) bool { return zones[i].stats.name < zones[j].stats.name })
		names := make([]string, len(zones))
		byName := make(map[string]*banZone, len(zones))
		for i := range zones {
			names[i] = zones[i].stats.name
			byName[names[i]] = &zones[i]
		}
		src := storeSource{Name: s.name, Source: "node"}
		var bans []limiter.BanRecord
		if s.redis != nil {
			src.Source = "fleet"
			r := s.readBans(names, limit, s.readDeadline(now))
			src.read(r.at, r.stale, r.err)
			bans = r.val
			if r.stale {
				bans = agedBans(bans, now.Sub(r.at))
			}
		} else {
			var err error
			if bans, err = zones[0].keeper.Bans(ctx, names, limit); err != nil {
				src.Error = err.Error()
			}
		}
		out.Stores = append(out.Stores, src)
		for i := range bans {
			if z := byName[bans[i].Zone]; z != nil {
				out.Bans = append(out.Bans, banOf(s, z, &bans[i]))
			}
		}
	}
	sort.SliceStable(out.Bans, func(i, j int) bool { return out.Bans[i].End.After(out.Bans[j].End) })
	return out
}

// bansReadTimeout bounds a read of a Redis store's ban lists, off the
// request (the registry's own bound).
const bansReadTimeout = 2 * time.Second

// readBans returns the Redis store's bans of zones: what Redis answers by
// deadline, else the last read, stale. Bans are not reused
// while young: a lift shows at once.
func (s *storeStats) readBans(zones []string, limit int, deadline time.Time) reading[[]limiter.BanRecord] {
	return s.bansRead.get(s.ctx, fmt.Sprint(zones, limit), 0, deadline, bansReadTimeout, func(ctx context.Context) ([]limiter.BanRecord, error) {
		return s.redis.Bans(ctx, zones, limit)
	})
}

// forgetBan drops a lifted ban from the store's last reads of its bans, so
// that a list answered from them, stale, does not show it.
func (s *storeStats) forgetBan(rec *limiter.BanRecord) {
	s.bansRead.edit(func(bans []limiter.BanRecord) []limiter.BanRecord {
		return slices.DeleteFunc(slices.Clone(bans), func(b limiter.BanRecord) bool {
			return b.Zone == rec.Zone && b.Key == rec.Key
		})
	})
}

// agedBans returns the bans of a read age ago as they stand now: what is
// left of each, less those that have ended.
func agedBans(bans []limiter.BanRecord, age time.Duration) []limiter.BanRecord {
	out := make([]limiter.BanRecord, 0, len(bans))
	for _, b := range bans {
		if b.Left -= age; b.Left > 0 {
			out = append(out, b)
		}
	}
	return out
}

// liftBan lifts the ban of target, a client key or its digest, in every
// store's zone named zone, if that zone is in scope. It returns what it
// lifted, or the HTTP status and error of a failure (404: no such zone in
// scope, or no such ban, with the reason). The errors never hold target:
// they may be logged, and a key is client data.
func liftBan(ctx context.Context, zone, target string, in scope) (*liftBody, int, error) {
	byStore := banZones(zone, in)
	if len(byStore) == 0 {
		if in != nil && len(banZones(zone, nil)) > 0 {
			return nil, http.StatusNotFound, fmt.Errorf("zone %q is not one of this server's zones: this dashboard shows and lifts the bans of its own server's zones only (the admin API, or the dashboard's `scope all`, reaches every server's)", zone)
		}
		return nil, http.StatusNotFound, fmt.Errorf("no zone %q with bans in the running configuration", zone)
	}
	out := &liftBody{Lifted: []banJSON{}}
	var errs []string
	for _, s := range sortedStores(byStore) {
		z := &byStore[s][0]
		listed, err := z.keeper.Bans(ctx, []string{zone}, limiter.MaxBanRecords)
		if err != nil {
			errs = append(errs, s.name+": "+err.Error())
		}
		for _, c := range liftCandidates(z, listed, target) {
			rec, lifted, err := z.keeper.Unban(ctx, zone, c.bucket, c.key)
			if err != nil {
				errs = append(errs, s.name+": "+err.Error())
			}
			if lifted {
				out.Lifted = append(out.Lifted, banOf(s, z, &rec))
				s.forgetBan(&rec)
			}
		}
	}
	out.Error = strings.Join(errs, "; ")
	switch {
	case len(out.Lifted) > 0:
		return out, 0, nil
	case out.Error != "":
		return nil, http.StatusBadGateway, errors.New(out.Error)
	case mayBeDigest(target):
		return nil, http.StatusNotFound, fmt.Errorf("no ban of that key in zone %q; if it is a key digest, a digest can only be resolved through the ban registry, which lists no ban with it (a ban the registry lost, or one that ended): name the raw key instead", zone)
	}
	return nil, http.StatusNotFound, fmt.Errorf("no ban of that key in zone %q (tried as a raw key under each of the zone's key alternatives, as a key as the registry lists it, and as a key digest in the registry)", zone)
}

// liftTarget is a bucket key whose ban a lift tries to lift.
type liftTarget struct{ bucket, key string }

// liftCandidates returns the bans that target may name in zone z: the
// registry's ban whose key or key digest it is when the registry lists
// one; otherwise the key as it is (a bucket key, "2,<value>") and the keys
// the zone makes of it as a raw value, under each of its key alternatives.
func liftCandidates(z *banZone, listed []limiter.BanRecord, target string) []liftTarget {
	if b := findBan(listed, target, z.info.digest); b != nil {
		return []liftTarget{{b.Bucket, b.Key}}
	}
	bucket := z.info.buckets[0]
	keys := []string{target}
	if z.info.keys != nil {
		for _, k := range z.info.keys(target) {
			if !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	out := make([]liftTarget, len(keys))
	for i, k := range keys {
		out[i] = liftTarget{bucket, k}
	}
	return out
}

// mayBeDigest reports whether s has the form of a key digest
// (limiter.Digester: 12 characters of base64url).
func mayBeDigest(s string) bool {
	if len(s) != 12 {
		return false
	}
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// findBan returns the listed ban whose key is target, or else whose key's
// digest is target, or nil.
func findBan(bans []limiter.BanRecord, target string, digest limiter.Digester) *limiter.BanRecord {
	for i := range bans {
		if bans[i].Key == target {
			return &bans[i]
		}
	}
	for i := range bans {
		if digest.Digest(bans[i].Key) == target {
			return &bans[i]
		}
	}
	return nil
}

// serveBans answers the bans' routes; rest is the path after "bans/" ("" for
// the list, "<zone>/<key>" for a lift).
func serveBans(w http.ResponseWriter, r *http.Request, rest string, in scope) (int, error) {
	switch {
	case (r.Method == http.MethodGet || r.Method == http.MethodHead) && rest == "":
		return serveBanList(w, r, in)
	case r.Method == http.MethodDelete:
		return serveLift(w, r, rest, in)
	case rest != "":
		w.Header().Set("Allow", "DELETE")
	default:
		w.Header().Set("Allow", "GET, HEAD, DELETE")
	}
	return http.StatusMethodNotAllowed, fmt.Errorf("method not allowed: %s", r.Method)
}

// serveBanList answers GET /rate_limit/bans?zone=NAME&limit=N (limit 1 to
// limiter.MaxBanRecords, default bansDefaultLimit).
func serveBanList(w http.ResponseWriter, r *http.Request, in scope) (int, error) {
	limit, err := intParam(r, "limit", bansDefaultLimit, 1, limiter.MaxBanRecords, "bans")
	if err != nil {
		return http.StatusBadRequest, err
	}
	return answerJSON(w, r, collectBans(r.Context(), time.Now(), r.URL.Query().Get("zone"), limit, in))
}

// serveLift answers DELETE /rate_limit/bans/<zone>/<key or digest>, and
// DELETE /rate_limit/bans?zone=Z&key=K.
func serveLift(w http.ResponseWriter, r *http.Request, rest string, in scope) (int, error) {
	zone, target, ok := strings.Cut(rest, "/")
	if rest == "" {
		q := r.URL.Query()
		zone, target, ok = q.Get("zone"), q.Get("key"), true
	}
	if !ok || zone == "" || target == "" {
		return http.StatusBadRequest, errors.New("name the ban to lift: DELETE bans/<zone>/<key or key digest>")
	}
	if len(target) > maxLiftTarget || strings.ContainsFunc(target, func(c rune) bool { return c <= ' ' || c == 0x7f }) {
		return http.StatusBadRequest, errors.New("no client key or digest is that long or holds spaces or control characters")
	}
	body, status, err := liftBan(r.Context(), zone, target, in)
	if err != nil {
		return status, err
	}
	return answerJSON(w, r, body)
}
