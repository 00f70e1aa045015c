package limiter

import (
	"fmt"
	"time"
)

// Period is a quota's calendar period: a day, a week (from Monday) or a
// month, in the quota's time zone.
type Period uint8

// The calendar periods.
const (
	// Day runs from a date's first moment to the next date's.
	Day Period = iota + 1
	// Week runs from a Monday's first moment to the next Monday's.
	Week
	// Month runs from the first moment of a month's first day to the
	// next month's.
	Month
)

// ParsePeriod parses "day", "week" or "month".
func ParsePeriod(s string) (Period, error) {
	switch s {
	case "day":
		return Day, nil
	case "week":
		return Week, nil
	case "month":
		return Month, nil
	}
	return 0, fmt.Errorf("unknown quota period %q (want day, week or month)", s)
}

// String names the period as the configuration does.
func (p Period) String() string {
	switch p {
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	}
	return ""
}

// nominal is the period's usual length, for what only needs its scale (a
// local rule's description, statistics).
func (p Period) nominal() time.Duration {
	switch p {
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 30 * 24 * time.Hour
	}
	return 24 * time.Hour
}

// bounds returns the period of the calendar in loc that holds instant t:
// its first instant and the next period's. A period starts at the first
// instant whose wall clock reads its first date, 00:00, or later, so that
// periods follow each other without gap or overlap whatever the clocks
// do: a midnight skipped by a daylight-saving change starts the day when
// the clocks jump (a date skipped whole, as Samoa's 30 December 2011,
// makes no period), and a midnight read twice starts the day at the
// first.
func (p Period) bounds(t time.Time, loc *time.Location) (start, end time.Time) {
	y, m, d := t.In(loc).Date()
	switch p {
	case Week:
		wd := int(t.In(loc).Weekday()+6) % 7 // days since Monday
		d -= wd
	case Month:
		d = 1
	}
	start = wallStart(y, m, d, loc)
	end = p.after(y, m, d, loc)
	// The wall clock can read an earlier date after the period began (an
	// hour repeated across midnight): the instant then belongs to the
	// following period. Bounded: each step moves a whole period on.
	for i := 0; i < 4 && !end.After(t); i++ {
		start = end
		y, m, d = p.step(y, m, d)
		end = p.after(y, m, d, loc)
	}
	return start, end
}

// step returns the first date of the period after the one that starts on
// y-m-d.
func (p Period) step(y int, m time.Month, d int) (int, time.Month, int) {
	var t time.Time
	switch p {
	case Week:
		t = time.Date(y, m, d+7, 0, 0, 0, 0, time.UTC)
	case Month:
		t = time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC)
	default:
		t = time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)
	}
	return t.Date()
}

// after returns the first instant of the period after the one that starts
// on y-m-d.
func (p Period) after(y int, m time.Month, d int, loc *time.Location) time.Time {
	y, m, d = p.step(y, m, d)
	return wallStart(y, m, d, loc)
}

// wallStart returns the first instant at which the wall clock of loc reads
// y-m-d 00:00 or later. time.Date alone does not: for a midnight that a
// daylight-saving change skips it may return an instant of the day before,
// and for one read twice either of them. So it walks the zone's offsets
// from well before the date (no offset is beyond ±15h): within one offset
// the wall clock runs with time, and the first offset in which it reaches
// the date gives the instant.
func wallStart(y int, m time.Month, d int, loc *time.Location) time.Time {
	wall := time.Date(y, m, d, 0, 0, 0, 0, time.UTC) // the reading, as if UTC
	t := wall.Add(-16 * time.Hour).In(loc)
	for range 16 { // a handful of transitions at most lie in 32 hours
		_, off := t.Zone()
		at := wall.Add(-time.Duration(off) * time.Second) // the reading in this offset
		if at.Before(t) {
			at = t
		}
		_, end := t.ZoneBounds()
		if end.IsZero() || at.Before(end) {
			return at
		}
		t = end
	}
	return t
}
