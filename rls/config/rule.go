package config

import "fmt"

// newLimit checks a descriptor's rate_limit by the reference's rules and the
// extensions', and returns its Limit. fullKey is the descriptor's full key
// and path the levels from the domain's first down to the descriptor.
func newLimit(d *rawDescriptor, domain, fullKey string, path []*node) (*Limit, error) {
	rl := d.rateLimit
	unit, err := rl.checkUnit()
	if err != nil {
		return nil, err
	}
	replaces, err := rl.checkReplaces()
	if err != nil {
		return nil, err
	}
	alg, err := rl.checkExtensions(fullKey, unit)
	if err != nil {
		return nil, err
	}
	return &Limit{
		Domain:          domain,
		FullKey:         fullKey,
		Source:          d.at,
		Name:            rl.name,
		RequestsPerUnit: rl.requestsPerUnit,
		Unit:            unit,
		Unlimited:       rl.unlimited,
		Replaces:        replaces,
		ShadowMode:      d.shadowMode,
		QuotaMode:       d.quotaMode,
		DetailedMetric:  d.detailedMetric,
		Metadata:        d.metadata,
		Algorithm:       alg,
		Burst:           rl.burst,
		Zone:            rl.zone,
		path:            path,
	}, nil
}

// checkUnit checks the unit as the reference does: a rule needs one unless
// it is unlimited, and an unlimited rule takes none. (An unlimited rule
// with a word that is no unit passes there, and so here.) A rule with a
// zone takes the zone's rate; checkExtensions checks it.
func (rl *rawRateLimit) checkUnit() (Unit, error) {
	unit, valid := ParseUnit(rl.unit)
	switch {
	case rl.hasZone:
		return UnitUnknown, nil
	case rl.unlimited && valid:
		return UnitUnknown, fmt.Errorf("%s: an unlimited rule takes no unit (remove unit %q)", place(rl.unitAt, rl.at), rl.unit)
	case rl.unlimited:
		return UnitUnknown, nil
	case !valid && !rl.hasUnit:
		return UnitUnknown, fmt.Errorf("%s: rate_limit needs a unit (second, minute, hour, day, week, month or year) or unlimited: true", rl.at)
	case !valid:
		return UnitUnknown, fmt.Errorf("%s: invalid rate limit unit %q (want second, minute, hour, day, week, month or year)", place(rl.unitAt, rl.at), rl.unit)
	}
	return unit, nil
}

// checkReplaces checks replaces as the reference does: every entry names a
// rule, and not the rule's own name. It returns the names.
func (rl *rawRateLimit) checkReplaces() ([]string, error) {
	if len(rl.replaces) == 0 {
		return nil, nil
	}
	names := make([]string, len(rl.replaces))
	for i, r := range rl.replaces {
		switch {
		case r.name == "":
			return nil, fmt.Errorf("%s: a replaces entry needs a name", place(r.at, rl.at))
		case r.name == rl.name:
			return nil, fmt.Errorf("%s: a rule cannot replace itself (%q)", place(r.at, rl.at), r.name)
		}
		names[i] = r.name
	}
	return names, nil
}
