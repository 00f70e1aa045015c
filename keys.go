package fleetlimit

import (
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// keyExpr is one key expression of a zone, prepared so that a request
// evaluates it with as little work as it needs: a constant costs nothing, a
// lone placeholder is one lookup, and only mixed text goes through the full
// replacer.
type keyExpr struct {
	text        string // the expression
	constant    bool   // no placeholder at all: text is the key
	placeholder string // set when the whole expression is one placeholder
	header      string // a lone request header placeholder: the canonical field name
	clientIP    bool   // the lone placeholder {http.vars.client_ip}
}

func newKeyExpr(e string) keyExpr {
	k := keyExpr{text: e}
	switch {
	case !strings.Contains(e, "{"):
		k.constant = true
	case strings.HasPrefix(e, "{") && strings.HasSuffix(e, "}") && strings.Count(e, "{") == 1 && strings.Count(e, "}") == 1:
		k.placeholder = e[1 : len(e)-1]
		// The two most common keys skip the replacer's search through
		// its providers: a header, and the client IP.
		if name, ok := strings.CutPrefix(k.placeholder, "http.request.header."); ok && name != "" {
			k.header = textproto.CanonicalMIMEHeaderKey(name)
		}
		k.clientIP = k.placeholder == "http.vars.client_ip"
	}
	return k
}

// eval returns the expression's value for a request; unknown placeholders
// are empty. A header with several values is their comma-separated list,
// as Caddy's placeholder gives it.
func (k keyExpr) eval(r *http.Request, repl *caddy.Replacer) string {
	switch {
	case k.constant:
		return k.text
	case k.header != "":
		switch vals := r.Header[k.header]; len(vals) {
		case 0:
			return ""
		case 1:
			return vals[0]
		default:
			return strings.Join(vals, ",")
		}
	case k.clientIP:
		if ip, ok := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string); ok {
			return ip
		}
		v, _ := repl.GetString(k.placeholder)
		return v
	case k.placeholder != "":
		v, _ := repl.GetString(k.placeholder)
		return v
	default:
		return repl.ReplaceKnown(k.text, "")
	}
}

// defaultKey is the key of a zone in fleetlimit's form (rate and per) that
// names none: the client's IP address (as Caddy determines it, honouring
// trusted_proxies). A zone in caddy-ratelimit's form has none: one bucket.
const defaultKey = "{http.vars.client_ip}"

// provisionKeys compiles the zone's validated key expressions.
func (z *Zone) provisionKeys() {
	if z.quotaOf != nil {
		z.keys = z.quotaOf.keys // its zone's keys, provisioned before it
		return
	}
	exprs := z.Key
	if len(exprs) == 0 && !z.legacyForm() {
		// caddy-ratelimit's form keeps no key: one shared bucket.
		exprs = []string{defaultKey}
	}
	z.keys = make([]keyExpr, 0, len(exprs))
	for _, e := range exprs {
		z.keys = append(z.keys, newKeyExpr(e))
	}
}

// keyOf returns the zone's bounded client key for a request: the value of
// the first key alternative that is not empty, in the namespace of that
// alternative (limiter.SourceKey).
func (z *Zone) keyOf(r *http.Request, repl *caddy.Replacer) string {
	for i, k := range z.keys {
		if v := k.eval(r, repl); v != "" {
			return z.normalKey(i, v)
		}
	}
	return ""
}

// normalKey returns the bucket key of the value v of the zone's source-th
// key alternative: its network when the zone groups addresses, bounded and
// in the alternative's namespace.
func (z *Zone) normalKey(source int, v string) string {
	if z.IPv4Prefix != 0 || z.IPv6Prefix != 0 {
		v = networkOf(v, z.IPv4Prefix, z.IPv6Prefix)
	}
	return limiter.SourceKey(source, v)
}

// networkOf returns the network of an IP address key, as a prefix of the
// given length (an IPv4 address v4 bits, an IPv6 address v6 bits; 0 leaves
// that family alone). Keys that are not IP addresses are returned as they
// are.
func networkOf(key string, v4, v6 int) string {
	addr, err := netip.ParseAddr(key)
	if err != nil {
		return key
	}
	addr = addr.Unmap()
	bits := v6
	if addr.Is4() {
		bits = v4
	}
	if bits == 0 || bits == addr.BitLen() {
		return key
	}
	p, err := addr.Prefix(bits)
	if err != nil {
		return key
	}
	return p.String()
}
