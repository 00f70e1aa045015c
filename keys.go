package fleetlimit

import (
	"errors"
	"net/http"
	"net/textproto"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
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

// checkPlaceholders reports an expression whose braces do not form
// placeholders: every '{' must close with a '}' around a non-empty name,
// without nesting. (A stray brace would make every request's value wrong.)
func checkPlaceholders(e string) error {
	open := -1
	for i := 0; i < len(e); i++ {
		switch e[i] {
		case '{':
			if open >= 0 {
				return errors.New("nested '{'")
			}
			open = i
		case '}':
			if open < 0 {
				return errors.New("'}' without '{'")
			}
			if i == open+1 {
				return errors.New("empty placeholder {}")
			}
			open = -1
		}
	}
	if open >= 0 {
		return errors.New("'{' without '}'")
	}
	return nil
}
