package chaos

import (
	"fmt"
	"strings"
	"time"
)

// probePrefix starts the paths of the slot probe: /probe/<zone> is matched
// by that concurrency zone alone.
const probePrefix = "/probe/"

// denialSeparator parts, in a 429's body, the zone that denied the request
// from the error's message.
const denialSeparator = " | "

// Site writes the site block of the scenario: the tier map, the rate_limit
// block with redisBlock (empty for the memory store), a proxy to the
// upstream at upstream (host:port), and a 429 whose body names the zone
// that denied and the error's message. gen is written into a response header, so that a reload
// with the next gen is a new configuration.
func (s *Scenario) Site(redisBlock, upstream string, gen int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\theader X-Gen %d\n", gen)
	b.WriteString("\tmap {header.X-Tier} {tier_rate} {tier_burst} {\n")
	for _, t := range s.Tiers {
		fmt.Fprintf(&b, "\t\t%s %d %d\n", t.Name, t.Rate, t.Burst)
	}
	b.WriteString("\t}\n\trate_limit {\n\t\tlog_key\n")
	s.writeExempt(&b)
	if redisBlock != "" {
		b.WriteString(redisBlock)
	}
	for zi, z := range s.Zones {
		s.writeZone(&b, zi, z)
	}
	b.WriteString("\t}\n")
	fmt.Fprintf(&b, "\treverse_proxy %s\n", upstream)
	b.WriteString("\thandle_errors 429 {\n\t\trespond \"{http.rate_limit.exceeded.name}" + denialSeparator + "{http.error.message}\" 429\n\t}\n")
	return b.String()
}

func (s *Scenario) writeZone(b *strings.Builder, zi int, z *Zone) {
	fmt.Fprintf(b, "\t\tzone %s {\n", z.Name)
	line := func(format string, args ...any) { fmt.Fprintf(b, "\t\t\t"+format+"\n", args...) }
	if z.Global {
		line("key all")
	} else {
		line("key {header.X-Key} {client_ip}")
	}
	line("algorithm %s", z.Algorithm)
	if z.Algorithm == Concurrency {
		line("limit %d", z.Limit)
		line("lease %s", z.Lease)
	} else {
		z.writeRule(line)
	}
	if z.Ban != nil {
		line("ban %s after %d in %s", dur(z.Ban.Duration), z.Ban.After, dur(z.Ban.Window))
	}
	if z.DryRun {
		line("dry_run")
	}
	if e := s.zoneExempt(zi); e != "" {
		line("%s", e)
	}
	line("on_error %s", z.OnError)
	var paths []string
	for _, t := range s.Targets {
		for _, tz := range t.Zones {
			if tz == zi {
				paths = append(paths, t.Path)
			}
		}
	}
	if z.Algorithm == Concurrency {
		paths = append(paths, probePrefix+z.Name)
	}
	if len(paths) == 0 {
		paths = []string{"/unused/" + z.Name}
	}
	line("match {\n\t\t\t\tpath %s\n\t\t\t}", strings.Join(paths, " "))
	b.WriteString("\t\t}\n")
}

// writeRule writes, through line, the rule of a zone that is not a
// concurrency zone: its rate, burst and cost, and the policies drawn on it.
func (z *Zone) writeRule(line func(format string, args ...any)) {
	if z.Tiered {
		line("rate {tier_rate} %s", dur(z.Per))
		if z.Algorithm == TokenBucket {
			line("burst {tier_burst}")
		}
	} else {
		line("rate %d %s", z.Rate, dur(z.Per))
		if z.Burst > 0 {
			line("burst %d", z.Burst)
		}
	}
	if z.Cost > 0 {
		line("cost %d", z.Cost)
	} else {
		line("cost {header.X-Cost}")
	}
	switch {
	case z.Reserve > 0:
		line("reserve %d", z.Reserve)
	case z.Reserve < 0:
		line("reserve {header.X-Reserve}")
	}
	if z.Prefetch > 0 {
		line("prefetch %d", z.Prefetch)
	}
	if len(z.CountStatus) > 0 {
		line("count_status %s", strings.Join(z.CountStatus, " "))
	}
	if z.MaxWaiting > 0 {
		line("max_waiting %d", z.MaxWaiting)
	}
	if q := z.quotaLine(); q != "" {
		line("%s", q)
	}
	if z.SoftShed > 0 {
		line("soft_shed %d %s", z.SoftShed, dur(z.SoftShedMaxDelay))
	}
	if z.CostHeader {
		line("%s", z.costHeaderLine())
	}
}

// dur writes d as a Caddyfile duration.
func dur(d time.Duration) string {
	if d%time.Second == 0 {
		return fmt.Sprintf("%ds", d/time.Second)
	}
	return fmt.Sprintf("%dms", d/time.Millisecond)
}
