package observe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// A client key, looked up and reset by an operator across the fleet
// (serveKeys; the endpoints are in docs/observability.md): the key as a
// client sent it, a bucket key or a key digest. A lookup charges nothing
// (limiter.KeyKeeper.Peek), a reset fills the key's buckets again
// (limiter.KeyKeeper.ResetKey); neither logs the key, which may be a secret.

// maxKeyBody bounds a key sent as a request's body: 1 MiB, Go's own
// default header limit, far above the longest key a header carries with
// Caddy's default max_header_size of 16 KiB (20,408 bytes, measured).
const maxKeyBody = 1 << 20

// keysBody is the body of a key lookup.
type keysBody struct {
	// Node is this node's id (host name/process id).
	Node string `json:"node"`
	// Time is when the key was looked up, by this node's clock.
	Time time.Time `json:"time"`
	// Zone is the zone looked in.
	Zone string `json:"zone"`
	// Stores are the stores holding a zone of that name, each with the
	// error that kept its part out, if any.
	Stores []storeSource `json:"stores"`
	// Keys are the key's buckets: one per store and key alternative the
	// key was tried under.
	Keys []keyJSON `json:"keys"`
	// Note says how the key was taken, when that may surprise: a value
	// of a digest's form that no key seen here has.
	Note string `json:"note,omitempty"`
}

// keyJSON is one client key's state in a zone on one store.
type keyJSON struct {
	// Zone is the zone: the one looked in, or its quota (<zone>.quota).
	Zone  string `json:"zone"`
	Store string `json:"store"`
	// KeyDigest is the bucket key's digest (as logs, the feed and the bans
	// show it); Key the bucket key itself, only with log_key.
	KeyDigest string `json:"key_digest"`
	Key       string `json:"key,omitempty"`
	// Alternative is the key alternative (from 1) the raw key was taken
	// as; 0 when the key was named as a bucket key or by its digest.
	Alternative int `json:"alternative"`
	// Ban is the key's ban in force in the zone, null when none.
	Ban *keyBanJSON `json:"ban"`
	// DenialsTowardsBan counts the denials towards the key's next ban (a
	// zone with `ban` only).
	DenialsTowardsBan int64 `json:"denials_towards_ban"`
	// LastRule is the rule that applied last to the key on this node:
	// the zone's own, or the tier of a zone with tiers; null when this
	// node does not know (it did not decide the key lately).
	LastRule *ruleRef `json:"last_rule"`
	// Rules is the key's bucket under each of the zone's rules: its own,
	// or one per tier this node has compiled.
	Rules []keyRuleJSON `json:"rules"`
	// Error says why the store could not be read.
	Error string `json:"error,omitempty"`
}

// keyBanJSON is a key's ban in force.
type keyBanJSON struct {
	Until       time.Time `json:"until"`
	SecondsLeft int64     `json:"seconds_left"`
	Denials     int64     `json:"denials"`
}

// ruleRef names a rule: its algorithm and limit, and its tier.
type ruleRef struct {
	// Tier is "rate <r> per <p>, burst <b>" for a tier of a zone whose
	// rate or burst comes from placeholders; absent for the zone's own.
	Tier      string `json:"tier,omitempty"`
	Algorithm string `json:"algorithm"`
	Rate      int64  `json:"rate"`
	Per       string `json:"per"`
	Burst     int64  `json:"burst"`
}

// keyRuleJSON is a key's bucket under one rule, as a request of cost 0
// would find it.
type keyRuleJSON struct {
	ruleRef
	// Remaining is what the bucket holds (the windows: what the window
	// still admits; concurrency: free slots).
	Remaining int64 `json:"remaining"`
	// Full says the bucket is full: the key has spent nothing that still
	// counts.
	Full bool `json:"full"`
	// ResetSeconds is how long until the bucket is full again, rounded
	// up, and Reset that moment, by the store's clock.
	ResetSeconds int64     `json:"reset_seconds"`
	Reset        time.Time `json:"reset"`
	// SlotsHeld is, for a concurrency zone, the slots held now.
	SlotsHeld *int64 `json:"slots_held,omitempty"`
	// Quota is, for a quota zone (the `quota` algorithm), what the key
	// used of it in the current period: see quotaOf.
	Quota *quotaJSON `json:"quota,omitempty"`
}

// quotaJSON is a key's use of a quota in the current period.
type quotaJSON struct {
	Used   int64     `json:"used"`
	Limit  int64     `json:"limit"`
	Resets time.Time `json:"resets"`
}

// quotaSuffix ends the name of a zone's quota when the zone has a rate
// too: the quota is a zone of its own (see the handler's Zone.Quota),
// which a lookup of its zone shows beside it.
const quotaSuffix = ".quota"

// quotaOf is a key's use of a quota, for a rule whose algorithm is a
// quota: what it used of it in the current period, which ends when the
// bucket is full again; nil for the other algorithms.
func quotaOf(st *limiter.KeyState) *quotaJSON {
	if st.Rule.Algorithm() != limiter.Quota {
		return nil
	}
	return &quotaJSON{Used: max(0, st.Rule.Rate()-st.Remaining), Limit: st.Rule.Rate(), Resets: st.At.Add(st.ResetAfter)}
}

// resetBody is the body of a key reset.
type resetBody struct {
	Node  string       `json:"node"`
	Time  time.Time    `json:"time"`
	Zone  string       `json:"zone"`
	Reset []resetEntry `json:"reset"`
	Note  string       `json:"note,omitempty"`
	// Error says which store could not reset the key, or could not tell
	// every node.
	Error string `json:"error,omitempty"`
}

// resetEntry is a key reset in a zone on one store.
type resetEntry struct {
	Store       string `json:"store"`
	KeyDigest   string `json:"key_digest"`
	Key         string `json:"key,omitempty"`
	Alternative int    `json:"alternative"`
	// Buckets is how many of the key's buckets held something (0: it was
	// full already).
	Buckets int `json:"buckets"`
}

// keyZone is a live zone in scope, on a store that looks keys up.
type keyZone struct {
	stats  *zoneStats
	info   *zoneInfo
	keeper limiter.KeyKeeper
}

// keyZones returns the live zones named zone in scope, by store name.
func keyZones(zone string, in scope) []keyZone {
	var out []keyZone
	zoneRegistry.Range(func(_, v any) bool {
		z := v.(*zoneStats)
		if z.dead.Load() || z.name != zone || !in.has(z) {
			return true
		}
		info := z.info.Load()
		var keeper limiter.KeyKeeper
		switch {
		case z.store.redis != nil:
			keeper = z.store.redis
		case z.store.memory != nil:
			keeper = z.store.memory
		}
		if info != nil && keeper != nil {
			out = append(out, keyZone{stats: z, info: info, keeper: keeper})
		}
		return true
	})
	slices.SortFunc(out, func(a, b keyZone) int { return strings.Compare(a.stats.store.name, b.stats.store.name) })
	return out
}

// noKeyZone is the 404 of a zone not in scope.
func noKeyZone(zone string, in scope) error {
	if in != nil && len(keyZones(zone, nil)) > 0 {
		return fmt.Errorf("zone %q is not one of this server's zones: this dashboard looks up keys in its own server's zones only (the admin API, or the dashboard's `scope all`, reaches every server's)", zone)
	}
	return fmt.Errorf("no zone %q in the running configuration (a zone of a handler with disable_metrics cannot be looked up)", zone)
}

// keyCandidate is a bucket key a target names: the key, the alternative
// (from 1) a raw value was taken as, 0 otherwise.
type keyCandidate struct {
	key string
	alt int
}

// candidates returns the bucket keys target names in zone z, and a note
// when a target of a digest's form matched no key seen here. A digest is
// looked for among the zone's keys this node saw denied lately and the
// zone's ban registry.
func (z *keyZone) candidates(ctx context.Context, target string) ([]keyCandidate, string) {
	if mayBeDigest(target) {
		if k, ok := z.digestOf(ctx, target); ok {
			return []keyCandidate{{k, 0}}, ""
		}
	}
	var note string
	if mayBeDigest(target) {
		note = "no key this node saw denied lately, nor a ban in the zone's registry, has that digest: it was taken as a raw key; name the raw key if it is a digest"
	}
	if z.info.keys == nil {
		// A zone without key alternatives: one bucket for every request.
		return []keyCandidate{{"", 0}}, note
	}
	var out []keyCandidate
	for i, k := range z.info.keys(target) {
		out = append(out, keyCandidate{k, i + 1})
	}
	if isBucketKey(target) && !slices.ContainsFunc(out, func(c keyCandidate) bool { return c.key == target }) {
		out = append(out, keyCandidate{target, 0}) // a bucket key, as log_key shows it
	}
	return out, note
}

// isBucketKey reports whether k is a bucket key of a second or later key
// alternative ("2,<value>") or a hashed one ("#…"), as log_key shows them
// (limiter.SourceKey).
func isBucketKey(k string) bool {
	n, rest, ok := strings.Cut(k, ",")
	if ok {
		if i, err := strconv.Atoi(n); err != nil || i < 2 {
			return false
		}
		k = rest
	}
	if h, hashed := strings.CutPrefix(k, "#"); hashed {
		return len(h) == 22 && limiter.ClientKey(h) == h
	}
	return ok && k != "" && limiter.ClientKey(k) == k
}

// digestOf returns the key whose digest is d among those this node saw
// denied lately in the zone and the bans of its registry.
func (z *keyZone) digestOf(ctx context.Context, d string) (string, bool) {
	seen := z.stats.top.keys()
	seen = append(seen, z.stats.store.feed.keysOf(z.stats.name)...)
	if k, ok := z.keeper.(limiter.BanKeeper); ok {
		if bans, err := k.Bans(ctx, []string{z.stats.name}, limiter.MaxBanRecords); err == nil {
			for _, b := range bans {
				seen = append(seen, b.Key)
			}
		}
	}
	for _, k := range seen {
		if z.info.digest.Digest(k) == d {
			return k, true
		}
	}
	return "", false
}

// rules returns the rules the zone's keys are read under, and whether they
// are tiers.
func (i *zoneInfo) keyRules() ([]*limiter.Rule, bool) {
	if i.tiers != nil {
		if rs := i.tiers(); len(rs) > 0 {
			return rs, true
		}
	}
	return []*limiter.Rule{i.rule}, false
}

// refOf describes a rule, as a tier of the zone when tier.
func refOf(r *limiter.Rule, tier bool) ruleRef {
	ref := ruleRef{Algorithm: r.Algorithm().String(), Rate: r.Rate(), Per: r.Per().String(), Burst: r.Burst()}
	if r.Algorithm() == limiter.Quota {
		ref.Per = r.QuotaPeriod().String() + " " + r.Location().String()
	}
	if tier {
		ref.Tier = "rate " + strconv.FormatInt(r.Rate(), 10) + " per " + ref.Per + ", burst " + strconv.FormatInt(r.Burst(), 10)
	}
	return ref
}

// lookUpKey returns the state of target in every store's zone named zone,
// if in scope, or the HTTP status and error of a failure.
func lookUpKey(ctx context.Context, now time.Time, zone, target string, in scope) (*keysBody, int, error) {
	zones := keyZones(zone, in)
	if len(zones) == 0 {
		return nil, http.StatusNotFound, noKeyZone(zone, in)
	}
	if !strings.HasSuffix(zone, quotaSuffix) {
		zones = append(zones, keyZones(zone+quotaSuffix, in)...) // its quota, if any
	}
	out := &keysBody{Node: nodeID, Time: now, Zone: zone, Stores: []storeSource{}, Keys: []keyJSON{}}
	for i := range zones {
		z := &zones[i]
		src := storeSource{Name: z.stats.store.name, Source: "node"}
		if z.stats.store.redis != nil {
			src.Source = "fleet"
		}
		seenStore := slices.ContainsFunc(out.Stores, func(s storeSource) bool { return s.Name == src.Name })
		cands, note := z.candidates(ctx, target)
		out.Note = cmpOr(out.Note, note)
		rules, tiers := z.info.keyRules()
		for _, c := range cands {
			k := keyJSON{Zone: z.stats.name, Store: src.Name, KeyDigest: z.info.digest.Digest(c.key), Alternative: c.alt, Rules: []keyRuleJSON{}}
			if z.info.logKey {
				k.Key = c.key
			}
			if z.info.lastRule != nil {
				if r := z.info.lastRule(c.key); r != nil {
					ref := refOf(r, tiers)
					k.LastRule = &ref
				}
			} else {
				ref := refOf(z.info.rule, false)
				k.LastRule = &ref
			}
			states, err := z.keeper.Peek(ctx, rules, c.key)
			if err != nil {
				k.Error, src.Error = redisError(err), redisError(err)
				out.Keys = append(out.Keys, k)
				continue
			}
			for j := range states {
				st := &states[j]
				if st.BanLeft > 0 && k.Ban == nil {
					k.Ban = &keyBanJSON{Until: st.At.Add(st.BanLeft), SecondsLeft: retryAfterSeconds(st.BanLeft), Denials: st.BanDenials}
				}
				k.DenialsTowardsBan = max(k.DenialsTowardsBan, st.Denials)
				k.Rules = append(k.Rules, keyRuleOf(st, tiers))
			}
			out.Keys = append(out.Keys, k)
		}
		if !seenStore {
			out.Stores = append(out.Stores, src)
		}
	}
	return out, 0, nil
}

// keyRuleOf is the JSON of a key's state under one rule.
func keyRuleOf(st *limiter.KeyState, tier bool) keyRuleJSON {
	j := keyRuleJSON{
		ruleRef: refOf(st.Rule, tier), Remaining: st.Remaining, Full: st.ResetAfter <= 0,
		ResetSeconds: retryAfterSeconds(st.ResetAfter), Reset: st.At.Add(st.ResetAfter), Quota: quotaOf(st),
	}
	switch st.Rule.Algorithm() {
	case limiter.Concurrency:
		slots := st.Slots
		j.SlotsHeld, j.Full = &slots, slots == 0
	case limiter.Quota:
		// A period always has its end ahead: full is nothing used.
		j.Full = st.Remaining >= st.Rule.Rate()
	}
	return j
}

// resetKey resets target in every store's zone named zone, if in scope.
func resetKey(ctx context.Context, now time.Time, zone, target string, in scope) (*resetBody, int, error) {
	zones := keyZones(zone, in)
	if len(zones) == 0 {
		return nil, http.StatusNotFound, noKeyZone(zone, in)
	}
	out := &resetBody{Node: nodeID, Time: now, Zone: zone, Reset: []resetEntry{}}
	var errs []string
	for i := range zones {
		z := &zones[i]
		cands, note := z.candidates(ctx, target)
		out.Note = cmpOr(out.Note, note)
		rules, _ := z.info.keyRules()
		for _, c := range cands {
			n, err := z.keeper.ResetKey(ctx, rules, c.key)
			if err != nil {
				errs = append(errs, z.stats.store.name+": "+redisError(err))
				if n == 0 {
					continue
				}
			}
			e := resetEntry{Store: z.stats.store.name, KeyDigest: z.info.digest.Digest(c.key), Alternative: c.alt, Buckets: n}
			if z.info.logKey {
				e.Key = c.key
			}
			out.Reset = append(out.Reset, e)
		}
	}
	out.Error = strings.Join(errs, "; ")
	if len(out.Reset) == 0 && out.Error != "" {
		return nil, http.StatusBadGateway, errors.New(out.Error)
	}
	return out, 0, nil
}

// cmpOr returns a, or b if a is empty.
func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// serveKeys answers the keys' routes: GET (or HEAD) looks a key up, DELETE
// resets it, and POST looks up a key sent as its body. escaped is the
// request's escaped path after "keys" ("" for the query's form,
// "/<zone>/<key>" or, for a key in the body, "/<zone>").
func serveKeys(w http.ResponseWriter, r *http.Request, escaped string, in scope) (int, error) {
	allowed := []string{http.MethodGet, http.MethodHead, http.MethodDelete}
	if !keyInPath(escaped) {
		allowed = append(allowed, http.MethodPost)
	}
	if !slices.Contains(allowed, r.Method) {
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		return http.StatusMethodNotAllowed, fmt.Errorf("method not allowed: %s", r.Method)
	}
	zone, target, status, err := keyTarget(w, r, escaped)
	if err != nil {
		return status, err
	}
	now := time.Now()
	if r.Method == http.MethodDelete {
		body, status, err := resetKey(r.Context(), now, zone, target, in)
		if err != nil {
			return status, err
		}
		return answerJSON(w, r, body)
	}
	body, status, err := lookUpKey(r.Context(), now, zone, target, in)
	if err != nil {
		return status, err
	}
	return answerJSON(w, r, body)
}

// keyInPath reports whether the escaped path after "keys" names a key
// ("/<zone>/<key>"), not a zone only or nothing (the query's form).
func keyInPath(escaped string) bool {
	_, k, ok := strings.Cut(strings.TrimPrefix(escaped, "/"), "/")
	return ok && k != ""
}

// errNoKey is the 400 of a keys route that names no key.
var errNoKey = errors.New("name the key: keys/<zone>/<key or key digest>, keys?zone=Z&key=K, or keys/<zone> (or keys?zone=Z) with the key as the body of a POST (look up) or a DELETE (reset)")

// keyTarget returns the zone and the key a keys route names: the zone from
// the escaped path ("/<zone>/<key>" or "/<zone>") or the query's zone; the
// key from the same place (unescaped, slashes and all), or else, for a POST
// or a DELETE, the request's body as it is (at most maxKeyBody bytes). On
// failure it returns the HTTP status and the error, which never holds the
// key.
func keyTarget(w http.ResponseWriter, r *http.Request, escaped string) (zone, target string, status int, err error) {
	if escaped == "" || escaped == "/" {
		q := r.URL.Query()
		zone, target = q.Get("zone"), q.Get("key")
	} else {
		z, k, _ := strings.Cut(strings.TrimPrefix(escaped, "/"), "/")
		if zone, err = url.PathUnescape(z); err == nil {
			target, err = url.PathUnescape(k)
		}
		if err != nil {
			return "", "", http.StatusBadRequest, errors.New("the zone or the key is not validly escaped")
		}
	}
	if zone != "" && target == "" && (r.Method == http.MethodPost || r.Method == http.MethodDelete) {
		b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxKeyBody))
		if err != nil {
			if _, tooLong := errors.AsType[*http.MaxBytesError](err); tooLong {
				return "", "", http.StatusRequestEntityTooLarge, fmt.Errorf("a key in the body is at most %d bytes", maxKeyBody)
			}
			return "", "", http.StatusBadRequest, fmt.Errorf("reading the key: %w", err)
		}
		target = string(b)
	}
	if zone == "" || target == "" {
		return "", "", http.StatusBadRequest, errNoKey
	}
	return zone, target, 0, nil
}
