package fleetlimit

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// Priority shedding (reserve): the share of a zone's capacity a request must
// leave after its charge.

// parseReserve parses a reserve: a whole percentage from 0 to 99, with or
// without `%`.
func parseReserve(s string) (int64, bool) {
	s = strings.TrimSuffix(strings.TrimSpace(s), "%")
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n >= 0 && n <= 99
}

// checkReserve checks a zone's reserve as configured: a percentage or a
// placeholder expression.
func checkReserve(s string) error {
	if strings.ContainsAny(s, "{}") {
		if err := checkPlaceholders(s); err != nil {
			return fmt.Errorf("reserve %q is not a valid placeholder expression: %w", s, err)
		}
		return nil
	}
	if _, ok := parseReserve(s); !ok {
		return fmt.Errorf("reserve must be a whole percentage from 0 to 99 (30 or 30%%) or a placeholder, got %q", s)
	}
	return nil
}

// provisionReserve compiles a zone's validated reserve.
func (z *Zone) provisionReserve() {
	z.reserve, z.reserveExpr = 0, ""
	if s := strings.TrimSpace(z.Reserve); strings.ContainsAny(s, "{}") {
		z.reserveExpr = s
	} else if s != "" {
		z.reserve, _ = parseReserve(s)
	}
}

// reserveOf returns a request's reserve in the zone: a placeholder's value
// that is not a whole percentage from 0 to 99 is an error naming the zone
// and the value.
func (z *Zone) reserveOf(repl *caddy.Replacer) (int64, error) {
	if z.reserveExpr == "" {
		return z.reserve, nil
	}
	v := strings.TrimSpace(repl.ReplaceKnown(z.reserveExpr, ""))
	n, ok := parseReserve(v)
	if !ok {
		return 0, fmt.Errorf("zone %q: reserve %s gave %s: want a whole percentage from 0 to 99", z.Name, z.reserveExpr, quoteValue(v))
	}
	return n, nil
}
