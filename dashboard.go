package fleetlimit

import (
	"net/http"
	"strings"

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

// DashboardHandler serves the rate limit dashboard and its statistics (the
// same as the admin API's /rate_limit/ and /rate_limit/stats) on a site,
// for operators whose browsers cannot reach a node's admin endpoint. Put it
// behind authentication: with `log_key` its table shows client keys.
//
//	handle /rate-limits/* {
//	    basic_auth { ops <hash> }
//	    rate_limit_dashboard
//	}
//
// It answers the path's last segment: the page for a path ending in "/",
// "stats", "dashboard.js" and "dashboard.css"; any other path is redirected
// to itself with a trailing "/", so the page's relative links resolve.
type DashboardHandler struct{}

// CaddyModule returns the Caddy module information.
func (DashboardHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit_dashboard",
		New: func() caddy.Module { return new(DashboardHandler) },
	}
}

// ServeHTTP serves the dashboard.
func (DashboardHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	p := r.URL.Path
	name := p[strings.LastIndexByte(p, '/')+1:]
	if _, ok := dashboardFiles[name]; !ok && name != "stats" {
		http.Redirect(w, r, p+"/", http.StatusPermanentRedirect)
		return nil
	}
	if status, err := serveDashboard(w, r, name); err != nil {
		return caddyhttp.Error(status, err)
	}
	return nil
}

// UnmarshalCaddyfile sets up the handler from `rate_limit_dashboard`, which
// takes no arguments.
func (*DashboardHandler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if d.NextArg() || d.NextBlock(0) {
		return d.ArgErr()
	}
	return nil
}

func parseDashboardCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var d DashboardHandler
	err := d.UnmarshalCaddyfile(h.Dispenser)
	return d, err
}

// Interface guards
var (
	_ caddyhttp.MiddlewareHandler = DashboardHandler{}
	_ caddyfile.Unmarshaler       = (*DashboardHandler)(nil)
)
