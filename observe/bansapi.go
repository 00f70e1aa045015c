package observe

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// The bans of repeat offenders (a zone's `ban`), as the stores' registries
// list them (limiter.BanKeeper): for a Redis store the fleet's, for the
// memory store this process's.
//
//	GET    /rate_limit/bans                the bans in force (?zone=NAME&limit=N)
//	DELETE /rate_limit/bans/<zone>/<key>   lifts a ban across the fleet
//	DELETE /rate_limit/bans?zone=Z&key=K   the same (the dashboard's form)
//
// A ban shows its key's digest, under the digest secret of the handler that
// configured the zone, and the key itself only when that handler has
// log_key. To lift a ban, name its key or its digest: a digest is matched
// against the digests of the keys the registry lists.

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

// banZones returns, by store, the live zones named zone ("" for every
// zone) on stores that keep bans.
func banZones(zone string) map[*storeStats][]banZone {
	out := map[*storeStats][]banZone{}
	zoneRegistry.Range(func(_, v any) bool {
		z := v.(*zoneStats)
		if z.dead.Load() || (zone != "" && z.name != zone) {
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

// collectBans lists the bans in force of the zone named (of every zone if
// zone is ""), at most limit per zone and store.
func collectBans(ctx context.Context, now time.Time, zone string, limit int) *bansBody {
	out := &bansBody{Node: nodeID, Time: now, Stores: []storeSource{}, Bans: []banJSON{}}
	byStore := banZones(zone)
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
		if s.redis != nil {
			src.Source = "fleet"
		}
		bans, err := zones[0].keeper.Bans(ctx, names, limit)
		if err != nil {
			src.Error = redisError(err)
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

// liftBan lifts the ban of target, a key or its digest, in every store's
// zone named zone. It returns what it lifted, or the HTTP status and error
// of a failure (404: no such zone, or no such ban).
func liftBan(ctx context.Context, zone, target string) (*liftBody, int, error) {
	byStore := banZones(zone)
	if len(byStore) == 0 {
		return nil, http.StatusNotFound, fmt.Errorf("no zone %q with bans in the running configuration", zone)
	}
	out := &liftBody{Lifted: []banJSON{}}
	var errs []string
	for _, s := range sortedStores(byStore) {
		z := &byStore[s][0]
		bucket, key := z.info.buckets[0], target
		listed, err := z.keeper.Bans(ctx, []string{zone}, limiter.MaxBanRecords)
		if err != nil {
			errs = append(errs, s.name+": "+err.Error())
		}
		if b := findBan(listed, target, z.info.digest); b != nil {
			bucket, key = b.Bucket, b.Key
		}
		rec, lifted, err := z.keeper.Unban(ctx, zone, bucket, key)
		if err != nil {
			errs = append(errs, s.name+": "+err.Error())
		}
		if lifted {
			out.Lifted = append(out.Lifted, banOf(s, z, &rec))
		}
	}
	out.Error = strings.Join(errs, "; ")
	switch {
	case len(out.Lifted) > 0:
		return out, 0, nil
	case out.Error != "":
		return nil, http.StatusBadGateway, errors.New(out.Error)
	}
	return nil, http.StatusNotFound, fmt.Errorf("no ban of %q in zone %q", target, zone)
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
func serveBans(w http.ResponseWriter, r *http.Request, rest string) (int, error) {
	switch {
	case (r.Method == http.MethodGet || r.Method == http.MethodHead) && rest == "":
		return serveBanList(w, r)
	case r.Method == http.MethodDelete:
		return serveLift(w, r, rest)
	case rest != "":
		w.Header().Set("Allow", "DELETE")
	default:
		w.Header().Set("Allow", "GET, HEAD, DELETE")
	}
	return http.StatusMethodNotAllowed, fmt.Errorf("method not allowed: %s", r.Method)
}

// serveBanList answers GET /rate_limit/bans?zone=NAME&limit=N (limit 1 to
// limiter.MaxBanRecords, default bansDefaultLimit).
func serveBanList(w http.ResponseWriter, r *http.Request) (int, error) {
	limit, err := intParam(r, "limit", bansDefaultLimit, 1, limiter.MaxBanRecords, "bans")
	if err != nil {
		return http.StatusBadRequest, err
	}
	return answerJSON(w, r, collectBans(r.Context(), time.Now(), r.URL.Query().Get("zone"), limit))
}

// serveLift answers DELETE /rate_limit/bans/<zone>/<key or digest>, and
// DELETE /rate_limit/bans?zone=Z&key=K.
func serveLift(w http.ResponseWriter, r *http.Request, rest string) (int, error) {
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
	body, status, err := liftBan(r.Context(), zone, target)
	if err != nil {
		return status, err
	}
	return answerJSON(w, r, body)
}
