package fleetlimit

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// untilUTCMidnight returns the whole seconds until the next UTC midnight,
// rounded up, as Retry-After and t count them.
func untilUTCMidnight(now time.Time) int64 {
	u := now.UTC()
	next := time.Date(u.Year(), u.Month(), u.Day()+1, 0, 0, 0, 0, time.UTC)
	return int64((next.Sub(now) + time.Second - 1) / time.Second)
}

// TestQuotaZoneFields: a plan of a rate and a daily quota on the memory
// store. The quota is its own member of the fields ("plan.quota", q the
// quota, w the day's seconds, t the seconds to midnight UTC); a request
// the rate denies costs the quota nothing; once the quota is spent the
// denial's Retry-After is the time to the day's end.
func TestQuotaZoneFields(t *testing.T) {
	t.Parallel()
	h, _ := testHandler(t, `{"zones":[{"name":"plan","key":["{http.request.header.X-Key}"],"rate":2,"per":3600000000000,`+
		`"quota":3,"quota_per":"day"}]}`)
	if len(h.Zones) != 2 || h.Zones[1].Name != "plan.quota" || h.Zones[1].rule.Rate() != 3 {
		t.Fatalf("zones %v, want plan and plan.quota", h.Zones)
	}
	var hdrs []http.Header
	var got []int
	for _, key := range []string{"a", "a", "a", "b", "b", "b"} {
		status, hdr := serve(t, h, request("GET", "192.0.2.1", "X-Key: "+key))
		got, hdrs = append(got, status), append(hdrs, hdr)
	}
	// a: 2 by the rate, the third denied by the rate (and not charged to
	// the quota). b: the same; the quota has one left each.
	if want := []int{200, 200, 429, 200, 200, 429}; strconvInts(got) != strconvInts(want) {
		t.Fatalf("statuses %v, want %v", got, want)
	}
	if p := hdrs[0].Get("RateLimit-Policy"); p != `"plan";q=2;w=3600, "plan.quota";q=3;w=86400` {
		t.Errorf("RateLimit-Policy %q", p)
	}
	mid := untilUTCMidnight(time.Now())
	rl := hdrs[1].Get("RateLimit")
	if !strings.HasPrefix(rl, `"plan";r=0;t=3600, "plan.quota";r=1;t=`) || !near(rl[strings.LastIndex(rl, "=")+1:], mid) {
		t.Errorf("RateLimit %q, want the quota's r=1 and t=%d", rl, mid)
	}
	if rl := hdrs[2].Get("RateLimit"); !strings.Contains(rl, `"plan.quota";r=1;`) {
		t.Errorf("the rate's denial: RateLimit %q, want the quota untouched (r=1)", rl)
	}

	// A plan with a rate that never denies spends the quota.
	h, _ = testHandler(t, `{"zones":[{"name":"plan","key":["{http.request.header.X-Key}"],"rate":100,"per":1000000000,`+
		`"quota":2,"quota_per":"day","quota_tz":"UTC"}]}`)
	for i, want := range []int{200, 200, 429} {
		status, hdr := serve(t, h, request("GET", "192.0.2.1", "X-Key: c"))
		if status != want {
			t.Fatalf("request %d: %d, want %d", i+1, status, want)
		}
		if status == 429 {
			if ra := hdr.Get("Retry-After"); !near(ra, untilUTCMidnight(time.Now())) {
				t.Errorf("Retry-After %q, want the %d s to midnight UTC", ra, untilUTCMidnight(time.Now()))
			}
		}
	}
}

// TestQuotaTiers: a quota from a placeholder, one rule per distinct value.
func TestQuotaTiers(t *testing.T) {
	t.Parallel()
	h, _ := testHandler(t, `{"zones":[{"name":"monthly","key":["{http.request.header.X-Key}"],`+
		`"quota_placeholder":"{http.request.header.X-Plan}","quota_per":"month","quota_tz":"Europe/Berlin"}]}`)
	for _, c := range []struct {
		key, plan string
		admitted  int
	}{{"small", "2", 2}, {"big", "5", 5}} {
		n := 0
		for range 8 {
			status, hdr := serve(t, h, request("GET", "192.0.2.1", "X-Key: "+c.key, "X-Plan: "+c.plan))
			if status == 200 {
				n++
			}
			if p := hdr.Get("RateLimit-Policy"); !strings.HasPrefix(p, `"monthly";q=`+c.plan+`;w=`) {
				t.Errorf("RateLimit-Policy %q", p)
			}
		}
		if n != c.admitted {
			t.Errorf("plan %s: %d admitted of 8, want %d", c.plan, n, c.admitted)
		}
	}
	if status, _ := serve(t, h, request("GET", "192.0.2.1", "X-Key: x", "X-Plan: lots")); status != 500 {
		t.Errorf("a quota of %q: %d, want 500", "lots", status)
	}
}

// near reports whether the header value s is want, or a second less (the
// clock may cross a second between the request and the test's reading).
func near(s string, want int64) bool {
	n, err := strconv.ParseInt(s, 10, 64)
	return err == nil && (n == want || n == want+1 || n == want-1)
}

func strconvInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, " ")
}
