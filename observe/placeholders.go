package observe

import (
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// placeholderPrefix begins every placeholder of the rate limit.
const placeholderPrefix = "http.rate_limit."

// placeholders are one request's rate limit placeholders:
// {http.rate_limit.<zone>.remaining} and {http.rate_limit.<zone>.limit} of
// each zone whose result is known, and {http.rate_limit.exceeded.name},
// the zone that denied it. They reach the request's replacer as one
// provider (Replacer.Map), a closure holding them by value, rather than as
// values set one by one: a value set takes the replacer's lock, goes into
// its map (whose table a fresh request's replacer allocates on the first
// one) and is boxed, on every request, whether or not a log, a header or
// handle_errors ever reads it; the provider is one small allocation and
// answers only when asked.
//
// When several rate_limit handlers decide one request and two of them have
// a zone of the same name, the first handler's values are the ones read.
type placeholders struct {
	exceeded string
	n        int           // zones with values: inline[:n], then more
	inline   [2]zoneValues // the first two zones' values
	more     []zoneValues  // the others'
}

// zoneValues are a zone's placeholder values for one request.
type zoneValues struct {
	zone      *Zone
	remaining int64
	rate      int64 // the rate of the rule applied when it is not the zone's own (tiers); else 0
}

// add adds the values of a zone whose result is known.
func (p *placeholders) add(z *Zone, req *limiter.Request, res *limiter.Result) {
	v := zoneValues{zone: z, remaining: res.Remaining}
	if req.Rule != z.rule { // a rule from placeholders (tiers)
		v.rate = req.Rule.Rate()
	}
	if p.n < len(p.inline) {
		p.inline[p.n] = v
	} else {
		p.more = append(p.more, v)
	}
	p.n++
}

// register gives the placeholders to the request's replacer. p must not
// change afterwards: the provider holds a copy.
func (p *placeholders) register(repl *caddy.Replacer) {
	ph := *p
	repl.Map(func(key string) (any, bool) { return ph.get(key) })
}

// get is the replacer's provider of the placeholders. (Value receivers: the
// provider's closure then holds its copy of the placeholders in itself,
// one allocation.)
func (p placeholders) get(key string) (any, bool) {
	rest, ok := strings.CutPrefix(key, placeholderPrefix)
	if !ok {
		return nil, false
	}
	if rest == "exceeded.name" {
		return p.exceeded, p.exceeded != ""
	}
	if zone, ok := strings.CutSuffix(rest, ".remaining"); ok {
		if v, ok := p.zone(zone); ok {
			return v.remaining, true
		}
	} else if zone, ok := strings.CutSuffix(rest, ".limit"); ok {
		if v, ok := p.zone(zone); ok {
			if v.rate != 0 {
				return v.rate, true
			}
			return v.zone.limit, true
		}
	}
	return nil, false
}

// zone returns the values of the zone named.
func (p placeholders) zone(name string) (zoneValues, bool) {
	for i := range min(p.n, len(p.inline)) {
		if p.inline[i].zone.name == name {
			return p.inline[i], true
		}
	}
	for i := range p.more {
		if p.more[i].zone.name == name {
			return p.more[i], true
		}
	}
	return zoneValues{}, false
}
