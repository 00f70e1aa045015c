package config

import (
	"strings"
	"time"
)

// Unit is the time unit of a rule's rate. Its values are those of Envoy's
// RateLimitResponse.RateLimit.Unit (and, up to UnitYear, of
// envoy.type.v3.RateLimitUnit), so that a service converts it with a plain
// conversion.
type Unit int32

// The units.
const (
	UnitUnknown Unit = 0
	UnitSecond  Unit = 1
	UnitMinute  Unit = 2
	UnitHour    Unit = 3
	UnitDay     Unit = 4
	UnitMonth   Unit = 5
	UnitYear    Unit = 6
	UnitWeek    Unit = 7
)

// unitNames names the units as Envoy's enumeration does, by value.
var unitNames = [...]string{"UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK"}

// unitSeconds is each unit's length as the reference counts it: a month is
// 30 days and a year 365.
var unitSeconds = [...]int64{0, 1, 60, 3600, 86400, 30 * 86400, 365 * 86400, 7 * 86400}

// ParseUnit parses a unit's name in any case ("minute", "MINUTE"), as the
// reference does. UNKNOWN and any other name are not units.
func ParseUnit(s string) (Unit, bool) {
	upper := strings.ToUpper(s)
	for u := UnitSecond; int(u) < len(unitNames); u++ {
		if unitNames[u] == upper {
			return u, true
		}
	}
	return UnitUnknown, false
}

// String names the unit as Envoy does ("MINUTE").
func (u Unit) String() string {
	if u < 0 || int(u) >= len(unitNames) {
		return "UNKNOWN"
	}
	return unitNames[u]
}

// Valid reports whether u is a unit (not UnitUnknown or out of range).
func (u Unit) Valid() bool { return u > UnitUnknown && int(u) < len(unitNames) }

// Seconds returns the unit's length in seconds, with a month of 30 days and
// a year of 365 as the reference counts them, and 0 for an invalid unit.
// The reference's window for a unit starts at the multiples of it since
// the Unix epoch.
func (u Unit) Seconds() int64 {
	if !u.Valid() {
		return 0
	}
	return unitSeconds[u]
}

// Duration returns the unit's length (see Seconds), 0 for an invalid unit.
func (u Unit) Duration() time.Duration { return time.Duration(u.Seconds()) * time.Second }
