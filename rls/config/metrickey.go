package config

import "github.com/fleetlimit/caddy-fleetlimit/limiter"

// maxMetricKeyLen bounds a metric key. A longer key keeps its beginning
// and ends with a hash of the whole, so that two keys stay apart.
const maxMetricKeyLen = 256

// MetricKey returns the key under which the reference keeps the statistics
// of a descriptor that matched l: its FullKey, unless the match asks for
// the request's values. A rule with detailed_metric is kept per entry
// key_value ("api.user_alice.path_/x"); a level with value_to_metric adds
// its entry's value; a share_threshold wildcard keeps its pattern
// ("api.files_files/*"). entries must be the ones given to Match. Values
// from the request are bounded as client keys are (limiter.ClientKey: at
// most 64 safe bytes, else a hash), and so is the whole key (256 bytes);
// MetricHasValues says whether the key can hold them, so that a caller
// bounds how many such keys it keeps.
func (l *Limit) MetricKey(entries []Entry) string {
	if l.Override || len(entries) != len(l.path) {
		return l.FullKey
	}
	var buf [maxMetricKeyLen]byte
	key := append(buf[:0], l.Domain...)
	if l.DetailedMetric {
		key = l.appendDetailed(key, entries)
	} else {
		key = l.appendValued(key, entries)
	}
	if string(key) == l.FullKey {
		return l.FullKey
	}
	return bounded(key)
}

// MetricHasValues reports whether MetricKey can hold values of requests:
// for an override, a rule with detailed_metric, or one with value_to_metric
// on a level of its path.
func (l *Limit) MetricHasValues() bool {
	if l.Override || l.DetailedMetric {
		return true
	}
	for _, n := range l.path {
		if n.valueToMetric {
			return true
		}
	}
	return false
}

// appendDetailed appends the detailed metric key's levels: each entry's
// key_value (with the underscore even when the value is empty, as the
// reference writes it), or, when a level is a share_threshold wildcard,
// every level's key and value or shared pattern.
func (l *Limit) appendDetailed(key []byte, entries []Entry) []byte {
	shared := false
	for i, e := range entries {
		if n := l.path[i]; n.shareThreshold && n.kind(e) == byWildcard {
			shared = true
		}
	}
	for i, e := range entries {
		n := l.path[i]
		key = append(append(key, '.'), e.Key...)
		switch {
		case shared && n.shareThreshold && n.kind(e) == byWildcard:
			key = append(append(key, '_'), n.sharedValue(e)...)
		case !shared || e.Value != "":
			key = append(append(key, '_'), limiter.ClientKey(e.Value)...)
		}
	}
	return key
}

// appendValued appends the levels of the key that value_to_metric shapes:
// each entry's key, and the value that its level names (see metricValue).
func (l *Limit) appendValued(key []byte, entries []Entry) []byte {
	for i, e := range entries {
		key = append(append(key, '.'), e.Key...)
		if v := l.path[i].metricValue(e); v != "" {
			key = append(append(key, '_'), v...)
		}
	}
	return key
}

// metricValue is the value a level writes into a metric key without
// detailed_metric: a level found by key and value writes the value; a
// wildcard writes its pattern, or the request's value with value_to_metric
// (share_threshold wins over it); a level found by key writes the value
// with value_to_metric, else none.
func (n *node) metricValue(e Entry) string {
	switch n.kind(e) {
	case byValue:
		return e.Value
	case byWildcard:
		if n.valueToMetric && !n.shareThreshold {
			return limiter.ClientKey(e.Value)
		}
		return n.sharedValue(e)
	}
	if n.valueToMetric {
		return limiter.ClientKey(e.Value)
	}
	return ""
}

// bounded returns key as a string of at most maxMetricKeyLen bytes.
func bounded(key []byte) string {
	if len(key) <= maxMetricKeyLen {
		return string(key)
	}
	whole := string(key)
	sum := limiter.ClientKey(whole) // "#" and 22 characters
	return whole[:maxMetricKeyLen-len(sum)] + sum
}
