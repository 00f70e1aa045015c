package fleetlimit

import (
	"errors"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// keyExpr is one key expression of a zone, prepared so that a request
// evaluates it with as little work as it needs: a constant costs nothing, a
// lone placeholder is one lookup, and only mixed text goes through the full
// replacer.
type keyExpr struct {
	text        string // the expression
	constant    bool   // no placeholder at all: text is the key
	placeholder string // set when the whole expression is one placeholder
}

func newKeyExpr(e string) keyExpr {
	k := keyExpr{text: e}
	switch {
	case !strings.Contains(e, "{"):
		k.constant = true
	case strings.HasPrefix(e, "{") && strings.HasSuffix(e, "}") && strings.Count(e, "{") == 1 && strings.Count(e, "}") == 1:
		k.placeholder = e[1 : len(e)-1]
	}
	return k
}

// eval returns the expression's value for a request; unknown placeholders
// are empty.
func (k keyExpr) eval(repl *caddy.Replacer) string {
	switch {
	case k.constant:
		return k.text
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
