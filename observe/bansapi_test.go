package observe_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/observe"
)

// bansList is GET /rate_limit/bans.
type bansList struct {
	Stores []struct {
		Name, Source, Error string
	} `json:"stores"`
	Bans []struct {
		Zone        string    `json:"zone"`
		Store       string    `json:"store"`
		KeyDigest   string    `json:"key_digest"`
		Key         string    `json:"key"`
		Start       time.Time `json:"start"`
		End         time.Time `json:"end"`
		SecondsLeft int64     `json:"seconds_left"`
		Denials     int64     `json:"denials"`
	} `json:"bans"`
}

// banConfig is a handler on the memory store with zone: one request an
// hour per X-Key, a key banned for an hour after 2 denials.
func banConfig(zone, extra string) string {
	return fmt.Sprintf(`{"key_digest_secret":%q,"zones":[{"name":%q,"key":["{http.request.header.X-Key}"],"rate":1,"per":3600000000000,`+
		`"ban":{"duration":3600000000000,"after":2,"window":60000000000}}]%s}`, digestSecret, zone, extra)
}

func listBans(t *testing.T, query string) (bansList, string) {
	t.Helper()
	w, err := adminGet(t, http.MethodGet, "/rate_limit/bans"+query)
	if err != nil {
		t.Fatalf("GET bans%s: %v", query, err)
	}
	var l bansList
	if err := json.Unmarshal(w.Body.Bytes(), &l); err != nil {
		t.Fatalf("bans: %v\n%s", err, w.Body.String())
	}
	return l, w.Body.String()
}

func apiStatus(err error) int {
	if ae, ok := err.(caddy.APIError); ok {
		return ae.HTTPStatus
	}
	return 0
}

// TestBansAPI: GET /rate_limit/bans lists a zone's bans with the key's
// digest only (no log_key), its times and denials; DELETE by digest lifts
// the ban (the key is decided by its bucket again), a second DELETE finds
// nothing (404), and so does one of an unknown zone.
func TestBansAPI(t *testing.T) {
	t.Parallel()
	const zone = "unit_bans"
	h, _, _ := obsHandler(t, banConfig(zone, ""))
	const key = "sk_live_banned"
	before := time.Now()
	got := map[int]int{}
	for range 4 {
		st, _ := serve(t, h, key)
		got[st]++
	}
	if got[200] != 1 || got[429] != 3 {
		t.Fatalf("statuses %v, want 1 admitted and 3 denied", got)
	}
	l, body := listBans(t, "?zone="+zone)
	if len(l.Bans) != 1 || len(l.Stores) != 1 || l.Stores[0].Source != "node" || l.Stores[0].Name != "memory" {
		t.Fatalf("bans: %s", body)
	}
	b := l.Bans[0]
	digest := limiter.NewDigester([]byte(digestSecret)).Digest(key)
	if b.Zone != zone || b.KeyDigest != digest || b.Key != "" || strings.Contains(body, key) || b.Denials != 2 ||
		b.End.Sub(b.Start) != time.Hour || b.SecondsLeft < 3590 || b.SecondsLeft > 3600 || b.Start.Before(before.Add(-time.Second)) {
		t.Errorf("ban %+v, want %s's digest %s only, an hour from now, 2 denials", b, key, digest)
	}
	if !strings.Contains(body, `"start":"`+b.Start.Format(time.RFC3339)[:19]) {
		t.Errorf("start is not RFC 3339: %s", body)
	}
	if l, _ := listBans(t, "?zone=unit_bans_none"); len(l.Bans) != 0 || len(l.Stores) != 0 {
		t.Errorf("an unknown zone lists %+v", l)
	}
	for _, q := range []string{"?limit=0", "?limit=10001", "?limit=x"} {
		if _, err := adminGet(t, http.MethodGet, "/rate_limit/bans"+q); apiStatus(err) != http.StatusBadRequest {
			t.Errorf("bans%s: %v, want 400", q, err)
		}
	}

	if _, err := adminGet(t, http.MethodDelete, "/rate_limit/bans/unit_no_zone/"+digest); apiStatus(err) != http.StatusNotFound {
		t.Errorf("DELETE in an unknown zone: %v, want 404", err)
	}
	if _, err := adminGet(t, http.MethodDelete, "/rate_limit/bans/"+zone+"/nobody"); apiStatus(err) != http.StatusNotFound {
		t.Errorf("DELETE of a key not banned: %v, want 404", err)
	}
	if _, err := adminGet(t, http.MethodPost, "/rate_limit/bans"); apiStatus(err) != http.StatusMethodNotAllowed {
		t.Errorf("POST bans: %v, want 405", err)
	}
	w, err := adminGet(t, http.MethodDelete, "/rate_limit/bans/"+zone+"/"+digest)
	if err != nil {
		t.Fatalf("DELETE by digest: %v", err)
	}
	var lifted struct {
		Lifted []struct {
			Zone, KeyDigest, Key string
			Denials              int64
		} `json:"lifted"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &lifted); err != nil || len(lifted.Lifted) != 1 || lifted.Error != "" ||
		lifted.Lifted[0].Zone != zone || lifted.Lifted[0].Denials != 2 || strings.Contains(w.Body.String(), key) {
		t.Fatalf("DELETE answered %s (%v)", w.Body.String(), err)
	}
	if l, body := listBans(t, "?zone="+zone); len(l.Bans) != 0 {
		t.Errorf("still listed: %s", body)
	}
	// The bucket is still empty: denied, not banned; two more denials
	// ban the key again.
	if st, repl := serve(t, h, key); st != 429 || repl == nil {
		t.Errorf("after the lift: %d, want 429 from the bucket", st)
	}
	if _, err := adminGet(t, http.MethodDelete, "/rate_limit/bans/"+zone+"/"+digest); apiStatus(err) != http.StatusNotFound {
		t.Errorf("a second DELETE: %v, want 404", err)
	}
}

// TestBansAPIWithLogKey: with log_key the list shows the key, and a ban is
// lifted by its key too, in the query's form the dashboard sends.
func TestBansAPIWithLogKey(t *testing.T) {
	t.Parallel()
	const zone = "unit_bans_logkey"
	h, _, _ := obsHandler(t, banConfig(zone, `,"log_key":true`))
	const key = "user/42@example.com"
	for range 3 {
		serve(t, h, key)
	}
	l, body := listBans(t, "")
	found := false
	for _, b := range l.Bans {
		found = found || (b.Zone == zone && b.Key == key)
	}
	if !found {
		t.Fatalf("the ban of %s is not listed with its key: %s", key, body)
	}
	q := url.Values{"zone": {zone}, "key": {key}}
	w, err := adminGet(t, http.MethodDelete, "/rate_limit/bans?"+q.Encode())
	if err != nil || !strings.Contains(w.Body.String(), `"key":"`+key+`"`) {
		t.Fatalf("DELETE by key: %v %s", err, w.Body.String())
	}
	// The key holds a "/": the path form takes the rest of the path.
	for range 2 {
		serve(t, h, key)
	}
	if _, err := adminGet(t, http.MethodDelete, "/rate_limit/bans/"+zone+"/"+key); err != nil {
		t.Fatalf("DELETE by path: %v", err)
	}
}

// TestBansOnSite: the rate_limit_dashboard handler serves the bans and
// bans.js like the admin API (the page fetches them relative to itself),
// lifts a ban in the query's form, and redirects neither.
func TestBansOnSite(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		method, target string
		status         int
	}{
		{http.MethodGet, "/rate-limits/bans", http.StatusOK},
		{http.MethodGet, "/rate-limits/bans.js", http.StatusOK},
		{http.MethodDelete, "/rate-limits/bans?zone=unit_site_none&key=k", http.StatusNotFound},
		{http.MethodDelete, "/rate-limits/bans", http.StatusBadRequest},
		{http.MethodPost, "/rate-limits/bans", http.StatusMethodNotAllowed},
	} {
		w := httptest.NewRecorder()
		err := (&observe.DashboardHandler{}).ServeHTTP(w, httptest.NewRequest(c.method, c.target, nil), nil)
		status := w.Code
		var he caddyhttp.HandlerError
		if asHandlerError(err, &he) {
			status = he.StatusCode
		} else if err != nil {
			t.Fatalf("%s %s: %v", c.method, c.target, err)
		}
		if status != c.status || w.Header().Get("Location") != "" {
			t.Errorf("%s %s: %d (Location %q), want %d", c.method, c.target, status, w.Header().Get("Location"), c.status)
		}
	}
}

// TestBansLiftRawKey: on the memory store, a ban is lifted by the raw key
// the client sent, normalised as the zone normalises it: a long key (kept
// hashed) and a second key alternative's value (in a namespace of its
// own); a key without a ban answers 404 saying so.
func TestBansLiftRawKey(t *testing.T) {
	t.Parallel()
	const zone = "unit_bans_raw"
	h, _, _ := obsHandler(t, fmt.Sprintf(`{"key_digest_secret":%q,"zones":[{"name":%q,`+
		`"key":["{http.request.header.X-Other}","{http.request.header.X-Key}"],"rate":1,"per":3600000000000,`+
		`"ban":{"duration":3600000000000,"after":2,"window":60000000000}}]}`, digestSecret, zone))
	long := "sk_live_" + strings.Repeat("0123456789", 10) // longer than a key kept as it is
	for range 3 {
		serve(t, h, long)
	}
	if l, body := listBans(t, "?zone="+zone); len(l.Bans) != 1 {
		t.Fatalf("want one ban: %s", body)
	}
	w, err := adminGet(t, http.MethodDelete, "/rate_limit/bans?"+url.Values{"zone": {zone}, "key": {long}}.Encode())
	if err != nil || !strings.Contains(w.Body.String(), `"lifted":[{`) {
		t.Fatalf("lifting the hashed second-alternative key by its raw value: %v %s", err, w.Body.String())
	}
	if l, body := listBans(t, "?zone="+zone); len(l.Bans) != 0 {
		t.Errorf("still listed: %s", body)
	}
	_, err = adminGet(t, http.MethodDelete, "/rate_limit/bans?"+url.Values{"zone": {zone}, "key": {long}}.Encode())
	if apiStatus(err) != http.StatusNotFound || !strings.Contains(err.Error(), "no ban") || strings.Contains(err.Error(), long) {
		t.Errorf("a second lift: %v, want 404 saying there is no ban, without the key", err)
	}
}

// TestDashboardScopeValidate: the dashboard's scope is server (the
// default) or all.
func TestDashboardScopeValidate(t *testing.T) {
	t.Parallel()
	for scope, ok := range map[string]bool{"": true, "server": true, "all": true, "site": false, "ALL": false} {
		if err := (&observe.DashboardHandler{Scope: scope}).Validate(); (err == nil) != ok {
			t.Errorf("scope %q: %v", scope, err)
		}
	}
}
