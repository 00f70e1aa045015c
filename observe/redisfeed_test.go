package observe

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// TestDenialFeed: denials of two zones from two nodes come back newest
// first, each with its fields; the streams are capped, expire, and keep to
// their key names.
func TestDenialFeed(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	s := startRedisStats(t, limiter.RedisOptions{Address: r.Addr, KeyPrefix: "df:"})
	ctx := context.Background()
	at := time.UnixMicro(1_795_000_000_123_456)
	first := []Denial{
		{Time: at, Zone: "api", KeyDigest: "d1", Method: "GET", Host: "a.example", Path: "/x", ClientIP: "203.0.113.0/24", Node: "n1"},
		{Time: at.Add(time.Millisecond), Zone: "login", KeyDigest: "d2", Key: "alice", Method: "POST", Host: "a.example", Path: "/login", ClientIP: "203.0.113.9", Node: "n1", Banned: true},
	}
	if err := s.appendDenials(ctx, first); err != nil {
		t.Fatal(err)
	}
	// Later, from another node.
	if err := s.appendDenials(ctx, []Denial{{Time: at.Add(2 * time.Millisecond), Zone: "api", KeyDigest: "d3", Node: "n2", DryRun: true}}); err != nil {
		t.Fatal(err)
	}
	got, err := s.readDenials(ctx, []string{"api", "login", "idle"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d denials, want 3: %+v", len(got), got)
	}
	if got[0].KeyDigest != "d3" || got[0].Node != "n2" || !got[0].DryRun || got[0].Banned {
		t.Errorf("newest: %+v", got[0])
	}
	want := first[1]
	if got[1] != want {
		t.Errorf("second: %+v, want %+v", got[1], want)
	}
	if got[2] != first[0] || !got[2].Time.Equal(at) {
		t.Errorf("third: %+v, want %+v", got[2], first[0])
	}
	if one, err := s.readDenials(ctx, []string{"api", "login"}, 1); err != nil || len(one) != 1 || one[0].KeyDigest != "d3" {
		t.Errorf("limit 1: %+v, %v", one, err)
	}
	// A node that sends late: its older denial, added last, is not the
	// newest.
	if err := s.appendDenials(ctx, []Denial{{Time: at.Add(-time.Second), Zone: "api", KeyDigest: "d0", Node: "n3"}}); err != nil {
		t.Fatal(err)
	}
	if one, err := s.readDenials(ctx, []string{"api", "login"}, 1); err != nil || len(one) != 1 || one[0].KeyDigest != "d3" {
		t.Errorf("limit 1 after a late one: %+v, %v", one, err)
	}
	if all, err := s.readDenials(ctx, []string{"api", "login"}, 10); err != nil || len(all) != 4 || all[3].KeyDigest != "d0" {
		t.Errorf("after a late one: %+v, %v; want it last", all, err)
	}
	if none, err := s.readDenials(ctx, []string{"idle"}, 10); err != nil || len(none) != 0 {
		t.Errorf("idle zone: %+v, %v", none, err)
	}
	keys := r.MustDo("KEYS", "df:*")
	for _, k := range strings.Split(keys, "\n") {
		if k != "df:denials:{feed}:api" && k != "df:denials:{feed}:login" {
			t.Errorf("unexpected key %q", k)
		}
		if ttl, _ := strconv.Atoi(r.MustDo("TTL", k)); ttl <= 0 || ttl > int(DenialRetention/time.Second) {
			t.Errorf("%s has TTL %d", k, ttl)
		}
	}

	// The stream is capped at about DenialStreamLength entries.
	batch := make([]Denial, 500)
	for i := range batch {
		batch[i] = Denial{Time: at, Zone: "flood", KeyDigest: fmt.Sprint(i), Node: "n1"}
	}
	for range 6 {
		if err := s.appendDenials(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	n, _ := strconv.Atoi(r.MustDo("XLEN", "df:denials:{feed}:flood"))
	if n < DenialStreamLength || n > DenialStreamLength+200 {
		t.Errorf("the flood's stream holds %d entries, want about %d", n, DenialStreamLength)
	}
	all, err := s.readDenials(ctx, []string{"flood"}, 5000)
	if err != nil || len(all) != DenialStreamLength || all[0].KeyDigest != "499" {
		t.Errorf("reading the flood: %d entries (first %+v), %v; want %d, newest first", len(all), all[:min(1, len(all))], err, DenialStreamLength)
	}
}

// TestDenialFeedCluster: every zone's stream is in one slot, so that one
// pipeline reads them all.
func TestDenialFeedCluster(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	s := startRedisStats(t, limiter.RedisOptions{Addresses: c.Addrs(), KeyPrefix: "df:"})
	ctx := context.Background()
	var ds []Denial
	for i, z := range []string{"a", "b", "c", "d", "e"} {
		ds = append(ds, Denial{Time: time.Now(), Zone: z, KeyDigest: strconv.Itoa(i), Node: "n"})
	}
	if err := s.appendDenials(ctx, ds); err != nil {
		t.Fatal(err)
	}
	got, err := s.readDenials(ctx, []string{"a", "b", "c", "d", "e"}, 10)
	if err != nil || len(got) != 5 {
		t.Fatalf("%+v, %v", got, err)
	}
	slot := c.KeySlot(s.denialKey("a"))
	for _, z := range []string{"b", "c", "d", "e"} {
		if c.KeySlot(s.denialKey(z)) != slot {
			t.Errorf("zone %s's stream is not in the slot of zone a's", z)
		}
	}
}

// TestDenialFeedRefused: a user that may not run the stream commands gets
// ErrFeedRefused, naming the command.
func TestDenialFeedRefused(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	r.AddUser("nofeed", "pw", strings.Fields("resetkeys ~df:* resetchannels -@all +ping +hello +auth +time +evalsha +eval +script|load")...)
	s := startRedisStats(t, limiter.RedisOptions{Address: r.Addr, Username: "nofeed", Password: "pw", KeyPrefix: "df:"})
	ctx := context.Background()
	err := s.appendDenials(ctx, []Denial{{Time: time.Now(), Zone: "api", Node: "n"}})
	if !errors.Is(err, ErrFeedRefused) || !strings.Contains(err.Error(), "XADD") {
		t.Errorf("append: %v, want ErrFeedRefused naming XADD", err)
	}
	if _, err := s.readDenials(ctx, []string{"api"}, 10); !errors.Is(err, ErrFeedRefused) {
		t.Errorf("read: %v, want ErrFeedRefused", err)
	}
}
