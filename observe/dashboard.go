package observe

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	caddy.RegisterModule(DashboardHandler{})
	httpcaddyfile.RegisterHandlerDirective("rate_limit_dashboard", parseDashboardCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("rate_limit_dashboard", httpcaddyfile.Before, "respond")
}

// DashboardHandler serves the rate limit dashboard, its statistics and the
// denial feed (the same as the admin API's /rate_limit/, /rate_limit/stats
// and /rate_limit/denials) on a site,
// for operators whose browsers cannot reach a node's admin endpoint. Put it
// behind authentication: with `log_key` its tables show client keys and
// addresses, its bans (GET, and DELETE ?zone=Z&key=K, the admin API's
// /rate_limit/bans) can be lifted from it, and keys looked up and reset
// (GET and DELETE keys?zone=Z&key=K, the admin API's /rate_limit/keys).
//
//	handle /rate-limits/* {
//	    basic_auth { ops <hash> }
//	    rate_limit_dashboard
//	}
//
// It answers the path's last segment: the page for a path ending in "/",
// "stats", "denials", "bans", "keys", "dashboard.js", "bans.js", "keys.js" and "dashboard.css"; a GET or HEAD of any other
// path is redirected to itself with a trailing "/" (so that the page's
// relative links resolve), keeping the query. The redirect is relative to
// the path ("./<segment>/"): it cannot leave the site, whatever the path
// (`//evil.com` is sent to `./evil.com/`, on this site).
//
// It shows and acts on the zones of its own Caddy HTTP server (the server
// whose routes hold it) unless Scope says otherwise; the admin API's
// /rate_limit/ shows every server's:
//
//	rate_limit_dashboard {
//	    scope all
//	}
type DashboardHandler struct {
	// Scope is which zones the dashboard shows (statistics, denials and
	// bans) and whose bans it lifts: "server", those of rate_limit
	// handlers in the same Caddy HTTP server as the dashboard, or "all",
	// those of every server of the process. A zone of the same name on
	// the same store in two servers is one zone (one set of buckets), and
	// both servers' dashboards show it. Default: server.
	Scope string `json:"scope,omitempty"`
}

// The values of DashboardHandler.Scope.
const (
	scopeServer = "server"
	scopeAll    = "all"
)

// CaddyModule returns the Caddy module information.
func (DashboardHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit_dashboard",
		New: func() caddy.Module { return new(DashboardHandler) },
	}
}

// Validate checks the scope.
func (d *DashboardHandler) Validate() error {
	switch d.Scope {
	case "", scopeServer, scopeAll:
		return nil
	}
	return fmt.Errorf("scope must be server or all, got %q", d.Scope)
}

// scope returns the zones the dashboard serves a request about.
func (d *DashboardHandler) scope(r *http.Request) scope {
	if d.Scope == scopeAll {
		return nil
	}
	return serverScope(r.Context().Value(caddyhttp.ServerCtxKey))
}

// ServeHTTP serves the dashboard.
func (d *DashboardHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	p := r.URL.Path
	name := p[strings.LastIndexByte(p, '/')+1:]
	if _, ok := dashboardFiles[name]; !ok && name != "stats" && name != "denials" && name != "bans" && name != "keys" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		w.Header().Set("Location", slashRedirect(r.URL))
		w.WriteHeader(http.StatusPermanentRedirect)
		return nil
	}
	if status, err := serveDashboard(w, r, name, d.scope(r)); err != nil {
		return caddyhttp.Error(status, err)
	}
	return nil
}

// slashRedirect returns where a path without its trailing "/" goes: the
// same path with it, and the same query. It is a relative reference to the
// path's last segment, as sent ("./<segment>/"), never an absolute path:
// http.Redirect would send the path "//evil.com" to "//evil.com/", a
// network-path reference to another host. The "./" keeps a segment with a
// colon ("javascript:x") from reading as a scheme; the escaped path holds
// no "?", "#" or "\" (a "/" to browsers) of its own.
func slashRedirect(u *url.URL) string {
	p := u.EscapedPath()
	loc := "./" + p[strings.LastIndexByte(p, '/')+1:] + "/"
	if u.RawQuery != "" {
		loc += "?" + u.RawQuery
	}
	return loc
}

// UnmarshalCaddyfile sets up the handler from `rate_limit_dashboard`, which
// takes no arguments and an optional block:
//
//	rate_limit_dashboard {
//	    scope server|all
//	}
func (h *DashboardHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "scope":
			if !d.NextArg() {
				return d.ArgErr()
			}
			switch v := d.Val(); v {
			case scopeServer, scopeAll:
				h.Scope = v
			default:
				return d.Errf("scope must be server or all, got %q", v)
			}
			if d.NextArg() {
				return d.ArgErr()
			}
		default:
			return d.Errf("unknown subdirective %q of rate_limit_dashboard", d.Val())
		}
	}
	return nil
}

func parseDashboardCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	d := new(DashboardHandler)
	err := d.UnmarshalCaddyfile(h.Dispenser)
	return d, err
}

//go:embed dashboard
var dashboardFS embed.FS

// dashboardFiles are the dashboard's assets, by path under adminBase.
var dashboardFiles = map[string]string{
	"":              "dashboard/index.html",
	"dashboard.js":  "dashboard/dashboard.js",
	"dashboard.css": "dashboard/dashboard.css",
	"bans.js":       "dashboard/bans.js",
	"keys.js":       "dashboard/keys.js",
}

// serveDashboard serves one of the dashboard's resources by name ("" for
// the page, "stats" for the statistics, "denials" for the denial feed,
// "bans" for the bans, "keys" for a key's lookup and reset) about the zones in scope, or returns an error and
// its HTTP status. The admin API and the rate_limit_dashboard handler
// share it.
func serveDashboard(w http.ResponseWriter, r *http.Request, name string, in scope) (int, error) {
	if rest, ok := strings.CutPrefix(name, "bans"); ok && (rest == "" || rest[0] == '/') {
		return serveBans(w, r, strings.TrimPrefix(rest, "/"), in) // GET and DELETE
	}
	if rest, ok := strings.CutPrefix(name, "keys"); ok && (rest == "" || rest[0] == '/') {
		// serveKeys: GET and DELETE. The key may hold escaped slashes:
		// it is read from the escaped path (the admin API's form).
		if rest != "" {
			_, rest, _ = strings.Cut(r.URL.EscapedPath(), adminBase+"keys")
		}
		return serveKeys(w, r, rest, in)
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return http.StatusMethodNotAllowed, fmt.Errorf("method not allowed: %s", r.Method)
	}
	switch name {
	case "stats":
		return serveStats(w, r, in)
	case "denials":
		return serveDenials(w, r, in)
	}
	file, ok := dashboardFiles[name]
	if !ok {
		return http.StatusNotFound, fmt.Errorf("resource not found: %s", r.URL.Path)
	}
	body, err := dashboardFS.ReadFile(file)
	if err != nil {
		return http.StatusInternalServerError, err
	}
	h := w.Header()
	switch {
	case strings.HasSuffix(file, ".html"):
		h.Set("Content-Type", "text/html; charset=utf-8")
	case strings.HasSuffix(file, ".js"):
		h.Set("Content-Type", "text/javascript; charset=utf-8")
	case strings.HasSuffix(file, ".css"):
		h.Set("Content-Type", "text/css; charset=utf-8")
	}
	// Nothing but these files: no inline script, no other origin.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-cache")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if r.Method == http.MethodGet {
		_, _ = w.Write(body)
	}
	return 0, nil
}

func serveStats(w http.ResponseWriter, r *http.Request, in scope) (int, error) {
	series, err := intParam(r, "series", seriesSeconds, 0, seriesSeconds, "seconds")
	if err != nil {
		return http.StatusBadRequest, err
	}
	return answerJSON(w, r, collectStats(r.Context(), time.Now(), series, in))
}

// intParam returns the query parameter name of r, an integer from lo to hi,
// or def if it is absent; otherwise an error that states the range in unit.
func intParam(r *http.Request, name string, def, lo, hi int, unit string) (int, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s must be %d to %d %s", name, lo, hi, unit)
	}
	return n, nil
}

// answerJSON answers with v as a JSON body that no cache may keep (no body
// to a HEAD).
func answerJSON(w http.ResponseWriter, r *http.Request, v any) (int, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return http.StatusInternalServerError, err
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
	return 0, nil
}

// storeSource says where a store's part of a list (the denial feed, the
// bans) comes from: "fleet" (Redis: every node's) or "node" (this
// process's: the memory store, or for the feed a Redis store whose streams
// could not be read). Error says what kept the store's part from the list,
// or from being fresh.
type storeSource struct {
	// Name is the store's name, as in the stats.
	Name string `json:"name"`
	// Source is fleet or node.
	Source string `json:"source"`
	// Stale says Redis did not answer the latest read in time (or failed
	// it): the store's part is the last one read, at ReadAt.
	Stale bool `json:"stale"`
	// ReadAt is when the store's part was read from Redis; absent for
	// this node's own.
	ReadAt *time.Time `json:"read_at,omitempty"`
	// Error is why the latest read gave nothing new.
	Error string `json:"error,omitempty"`
}

// read records in src a read of Redis: when its value was read (zero:
// none), whether it is stale, and the latest read's error.
func (src *storeSource) read(at time.Time, stale bool, err error) {
	if !at.IsZero() {
		src.ReadAt = &at
	}
	src.Stale = stale
	if err != nil {
		src.Error = redisError(err)
	}
}

// redisError is the message of a failed read of Redis.
func redisError(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "redis did not answer in time"
	}
	return err.Error()
}

// Interface guards
var (
	_ caddyhttp.MiddlewareHandler = (*DashboardHandler)(nil)
	_ caddy.Validator             = (*DashboardHandler)(nil)
	_ caddyfile.Unmarshaler       = (*DashboardHandler)(nil)
)
