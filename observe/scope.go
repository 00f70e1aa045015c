package observe

// scope is which zones a view of the statistics, the denial feed and the
// bans shows and acts on: those it reports true for, every zone of the
// process when nil (the admin API, and a dashboard of scope all).
type scope func(*zoneStats) bool

// serverScope is the scope of a dashboard of scope server: the zones that
// handlers of the Caddy HTTP server srv hold (the *caddyhttp.Server in the
// request's context). A zone of the same name on the same store in another
// server is the same zone (the same buckets), and is in scope too.
func serverScope(srv any) scope {
	return func(z *zoneStats) bool { return z.heldIn(srv) }
}

// has reports whether the scope takes in z.
func (s scope) has(z *zoneStats) bool { return s == nil || s(z) }
