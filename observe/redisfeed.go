package observe

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/redis/go-redis/v9"
)

// The denial feed in Redis: nodes add a sample of the requests they deny to
// a capped stream per zone, so that any node can list what the whole fleet
// denied lately. The layout and an entry's fields are in docs/design.md,
// "The denial streams in Redis".

const (
	// DenialStreamLength is about how many denials each zone's stream
	// keeps (XADD MAXLEN ~): Redis trims it by whole nodes of the stream,
	// so it may hold a few more.
	DenialStreamLength = 1000
	// DenialRetention is how long a zone's stream is kept after its last
	// entry: a zone that no node denies in, or that left the
	// configuration, leaves no stream behind.
	DenialRetention = 24 * time.Hour
)

// denialReadAhead is how many more entries of each stream readDenials
// reads than it returns, to put in order what nodes sent late.
const denialReadAhead = 200

// ErrFeedRefused is the error of a denial feed command that Redis refused
// to the store's user (an ACL without +xadd or +xrevrange).
var ErrFeedRefused = errors.New("redis refuses the denial feed's commands to this user")

// Denial is one denied request in the denial feed.
type Denial struct {
	// Time is when the node denied the request, by the node's clock.
	Time time.Time
	// Zone is the name of the zone that denied it.
	Zone string
	// KeyDigest is the client key's digest (see limiter.Digester).
	KeyDigest string
	// Key is the client key itself; empty unless the node that denied
	// the request shows keys (log_key).
	Key string
	// Method, Host and Path are the request's method, host and path
	// (without the query), as the node recorded them; Path is empty
	// unless the node shows keys (log_key): a path can hold a secret.
	Method, Host, Path string
	// Route is what the zone's matchers match, from the configuration;
	// empty when the zone applies to every request of its handler.
	Route string
	// ClientIP is the client's address as the node recorded it: a
	// network ("203.0.113.0/24") unless the node shows keys.
	ClientIP string
	// Node is the id of the node that denied the request.
	Node string
	// Banned says the key was banned; DryRun that the zone only would
	// have denied the request (dry run: it passed).
	Banned, DryRun bool
}

// denialKey returns the Redis key of a zone's denial stream.
func (s *redisStats) denialKey(zone string) string {
	return s.prefix + "denials:{feed}:" + zone
}

// appendDenials adds denials to their zones' streams, in one pipeline
// (one round trip: every stream is in one hash slot), trimming each
// stream to about DenialStreamLength and renewing its DenialRetention.
// It is meant for a sample of the denials, off the request path.
func (s *redisStats) appendDenials(ctx context.Context, ds []Denial) error {
	if len(ds) == 0 {
		return nil
	}
	pipe := s.client.Pipeline()
	streams := make(map[string]bool, 1)
	for i := range ds {
		d := &ds[i]
		key := s.denialKey(d.Zone)
		streams[key] = true
		values := []any{
			"time", strconv.FormatInt(d.Time.UnixMicro(), 10),
			"zone", d.Zone,
			"key_digest", d.KeyDigest,
		}
		if d.Key != "" {
			values = append(values, "key", d.Key)
		}
		if d.Path != "" {
			values = append(values, "path", d.Path)
		}
		if d.Route != "" {
			values = append(values, "route", d.Route)
		}
		values = append(values,
			"method", d.Method,
			"host", d.Host,
			"client_ip", d.ClientIP,
			"node", d.Node,
			"banned", flag(d.Banned),
			"dry_run", flag(d.DryRun))
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: key, MaxLen: DenialStreamLength, Approx: true, Values: values})
	}
	for key := range streams {
		pipe.Expire(ctx, key, DenialRetention)
	}
	cmds, err := pipe.Exec(ctx)
	for _, c := range cmds {
		if c.Err() != nil {
			return feedError(c.Err())
		}
	}
	if err != nil {
		return feedError(err)
	}
	return nil
}

// readDenials returns the newest denials of the zones, newest first by the
// times of the nodes that denied them, at most limit. Nodes send their
// denials up to about a second late, so the order Redis added them in is
// not quite theirs: it reads denialReadAhead more of each stream than
// asked, and sorts them. Nodes whose clocks are off are misplaced by as
// much (see readClock).
func (s *redisStats) readDenials(ctx context.Context, zones []string, limit int) ([]Denial, error) {
	if len(zones) == 0 || limit <= 0 {
		return []Denial{}, nil
	}
	limit = min(limit, DenialStreamLength)
	pipe := s.client.Pipeline()
	reads := make([]*redis.XMessageSliceCmd, len(zones))
	for i, z := range zones {
		reads[i] = pipe.XRevRangeN(ctx, s.denialKey(z), "+", "-", int64(min(limit+denialReadAhead, DenialStreamLength)))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, feedError(err)
	}
	type entry struct {
		ms, seq uint64
		d       Denial
	}
	var all []entry
	for i, r := range reads {
		for _, m := range r.Val() {
			ms, seq, ok := parseStreamID(m.ID)
			if !ok {
				continue
			}
			all = append(all, entry{ms, seq, streamDenial(zones[i], m.Values)})
		}
	}
	// By the nodes' times (a node sends its denials up to a second
	// late), then by the order Redis added them.
	sort.SliceStable(all, func(i, j int) bool {
		a, b := &all[i], &all[j]
		if !a.d.Time.Equal(b.d.Time) {
			return a.d.Time.After(b.d.Time)
		}
		if a.ms != b.ms {
			return a.ms > b.ms
		}
		return a.seq > b.seq
	})
	out := make([]Denial, 0, min(len(all), limit))
	for _, e := range all[:min(len(all), limit)] {
		out = append(out, e.d)
	}
	return out, nil
}

// streamDenial reads one stream entry of a zone.
func streamDenial(zone string, v map[string]any) Denial {
	str := func(name string) string {
		s, _ := v[name].(string)
		return s
	}
	d := Denial{
		Zone:      zone,
		KeyDigest: str("key_digest"),
		Key:       str("key"),
		Method:    str("method"),
		Host:      str("host"),
		Path:      str("path"),
		Route:     str("route"),
		ClientIP:  str("client_ip"),
		Node:      str("node"),
		Banned:    str("banned") == "1",
		DryRun:    str("dry_run") == "1",
	}
	if us, err := strconv.ParseInt(str("time"), 10, 64); err == nil {
		d.Time = time.UnixMicro(us)
	}
	return d
}

// parseStreamID splits a stream entry ID, "<ms>-<seq>".
func parseStreamID(id string) (ms, seq uint64, ok bool) {
	a, b, ok := strings.Cut(id, "-")
	if !ok {
		return 0, 0, false
	}
	ms, err1 := strconv.ParseUint(a, 10, 64)
	seq, err2 := strconv.ParseUint(b, 10, 64)
	return ms, seq, err1 == nil && err2 == nil
}

// flag is a boolean field's value.
func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// feedError wraps a denial feed command's error, as ErrFeedRefused too
// when the user may not run the command.
func feedError(err error) error {
	if cmd, ok := limiter.RefusedCommand(err); ok {
		if cmd == "" {
			cmd = "a stream command"
		}
		return fmt.Errorf("%w (%s)", ErrFeedRefused, strings.ToUpper(cmd))
	}
	return fmt.Errorf("redis denial feed: %w", err)
}
