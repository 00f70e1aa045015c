package config

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
)

// FromXDS builds a Config from the RateLimitConfig resources of an xDS
// state-of-the-world update, as the reference builds one from the YAML
// files, with the same checks; an error names the resource by its name (or
// its domain) and the descriptor by its path in it. A domain may be in one
// resource only; the resources are taken in the order of their names (as
// the files are), since an update may list them in any order, so that
// which of two resources of one domain an error names does not change
// with it. The resources carry the reference's fields that their
// protocol has (no quota_mode, value_to_metric, share_threshold, metadata
// or extension); a unit is taken by its number, so that a MONTH or YEAR of
// a newer management server is understood.
func FromXDS(resources []*rlsconf.RateLimitConfig) (*Config, error) {
	b := newBuilder()
	order := make([]int, len(resources))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int { return cmp.Compare(xdsName(resources[i]), xdsName(resources[j])) })
	for _, i := range order {
		res := resources[i]
		if res == nil {
			continue
		}
		name := xdsName(res)
		at := fmt.Sprintf("rate limit config %q", name)
		if name == "" {
			at = fmt.Sprintf("rate limit config #%d", i)
		}
		d := &rawDomain{domain: res.GetDomain(), at: at}
		d.descriptors = xdsDescriptors(res.GetDescriptors(), at+": descriptors")
		if err := b.add(d); err != nil {
			return nil, err
		}
	}
	return b.cfg, nil
}

// xdsName is the name a resource is known by: its name, else its domain.
func xdsName(res *rlsconf.RateLimitConfig) string {
	if name := res.GetName(); name != "" {
		return name
	}
	return res.GetDomain()
}

// xdsDescriptors converts a list of descriptors; at places the list.
func xdsDescriptors(list []*rlsconf.RateLimitDescriptor, at string) []rawDescriptor {
	if len(list) == 0 {
		return nil
	}
	ds := make([]rawDescriptor, 0, len(list))
	for i, x := range list {
		if x == nil {
			continue
		}
		dAt := at + "[" + strconv.Itoa(i) + "]"
		ds = append(ds, rawDescriptor{
			key:            x.GetKey(),
			value:          x.GetValue(),
			rateLimit:      xdsRateLimit(x.GetRateLimit(), dAt+".rate_limit"),
			descriptors:    xdsDescriptors(x.GetDescriptors(), dAt+".descriptors"),
			shadowMode:     x.GetShadowMode(),
			detailedMetric: x.GetDetailedMetric(),
			at:             dAt,
		})
	}
	return ds
}

// xdsRateLimit converts a rate limit policy; nil is none.
func xdsRateLimit(p *rlsconf.RateLimitPolicy, at string) *rawRateLimit {
	if p == nil {
		return nil
	}
	rl := &rawRateLimit{
		requestsPerUnit: p.GetRequestsPerUnit(),
		unlimited:       p.GetUnlimited(),
		name:            p.GetName(),
		at:              at,
		unitAt:          at + ".unit",
	}
	// An unset unit is UNKNOWN, which is no unit: the checks then ask for
	// one unless the rule is unlimited, as in the reference.
	if u := Unit(p.GetUnit()); u.Valid() {
		rl.unit, rl.hasUnit = u.String(), true
	} else if u != UnitUnknown {
		rl.unit, rl.hasUnit = strconv.Itoa(int(u)), true
	}
	for i, r := range p.GetReplaces() {
		rl.replaces = append(rl.replaces, rawReplace{
			name: r.GetName(), at: at + ".replaces[" + strconv.Itoa(i) + "]",
		})
	}
	return rl
}
