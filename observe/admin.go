package observe

import (
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI serves the rate limiter's statistics and live dashboard on
// Caddy's admin endpoint:
//
//	GET /rate_limit/          the dashboard (HTML; every asset embedded)
//	GET /rate_limit/stats     the statistics, as JSON
//	GET /rate_limit/denials   the denial feed, as JSON (?zone=NAME&limit=N)
//	GET /rate_limit/bans      the bans in force, as JSON (?zone=NAME&limit=N)
//	DELETE /rate_limit/bans/<zone>/<key or key digest>   lifts a ban fleet-wide
//	GET /rate_limit/keys/<zone>/<key or key digest>      a key's state in a zone
//	DELETE /rate_limit/keys/<zone>/<key or key digest>   resets the key fleet-wide
//	POST, DELETE /rate_limit/keys/<zone>   the same two, the key as the body
//
// It needs no configuration: Caddy mounts every admin.api module.
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.rate_limit",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// adminBase is the path every route of the module starts with.
const adminBase = "/rate_limit/"

// Routes returns the module's admin routes.
func (a *adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: adminBase, Handler: caddy.AdminHandlerFunc(a.serve)}}
}

func (a *adminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	// The admin API is process-wide: every server's zones.
	if status, err := serveDashboard(w, r, strings.TrimPrefix(r.URL.Path, adminBase), nil); err != nil {
		return caddy.APIError{HTTPStatus: status, Err: err}
	}
	return nil
}

// Interface guards
var (
	_ caddy.AdminRouter = (*adminAPI)(nil)
)
