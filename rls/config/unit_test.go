package config

import (
	"testing"
	"time"
)

func TestUnits(t *testing.T) {
	for _, c := range []struct {
		names []string
		unit  Unit
		dur   time.Duration
	}{
		{[]string{"second", "SECOND", "Second"}, UnitSecond, time.Second},
		{[]string{"minute", "MiNuTe"}, UnitMinute, time.Minute},
		{[]string{"hour"}, UnitHour, time.Hour},
		{[]string{"day"}, UnitDay, 24 * time.Hour},
		{[]string{"week"}, UnitWeek, 7 * 24 * time.Hour},
		{[]string{"month"}, UnitMonth, 30 * 24 * time.Hour},
		{[]string{"year"}, UnitYear, 365 * 24 * time.Hour},
	} {
		for _, n := range c.names {
			u, ok := ParseUnit(n)
			if !ok || u != c.unit || u.Duration() != c.dur || u.Seconds() != int64(c.dur/time.Second) || !u.Valid() {
				t.Errorf("ParseUnit(%q) = %v, %v (%v)", n, u, ok, u.Duration())
			}
		}
	}
	for _, n := range []string{"", "unknown", "UNKNOWN", "seconds", "fortnight", "1"} {
		if u, ok := ParseUnit(n); ok {
			t.Errorf("ParseUnit(%q) = %v", n, u)
		}
	}
	for _, u := range []Unit{UnitUnknown, -1, 8} {
		if u.Valid() || u.Duration() != 0 || u.String() != "UNKNOWN" {
			t.Errorf("unit %d: valid %v, %v, %s", u, u.Valid(), u.Duration(), u)
		}
	}
	// Envoy's numbering, which a service converts by value.
	for u, name := range map[Unit]string{1: "SECOND", 2: "MINUTE", 3: "HOUR", 4: "DAY", 5: "MONTH", 6: "YEAR", 7: "WEEK"} {
		if u.String() != name {
			t.Errorf("unit %d is %s, want %s", u, u, name)
		}
	}
}
