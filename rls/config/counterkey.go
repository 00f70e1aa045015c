package config

// CounterValue returns the value that identifies the counter of the i-th of
// the entries that matched l: the entry's own value, or, where its level is
// a share_threshold wildcard, the wildcard ("files/*") that every value it
// matches shares, as the reference keys its counters. entries must be the
// ones given to Match (or Override).
func (l *Limit) CounterValue(entries []Entry, i int) string {
	if i < len(l.path) && len(entries) == len(l.path) {
		if n := l.path[i]; n.shareThreshold && n.kind(entries[i]) == byWildcard {
			return n.sharedValue(entries[i])
		}
	}
	return entries[i].Value
}

// AppendCounterKey appends to dst the reference's counter key of a
// descriptor that matched l, without its prefix and window:
// "domain_key1_value1_key2_value2_", each value as CounterValue gives it.
// The reference appends the window's start in seconds. The parts are the
// request's, unbounded: a store that keeps the key must bound it.
func (l *Limit) AppendCounterKey(dst []byte, entries []Entry) []byte {
	dst = append(append(dst, l.Domain...), '_')
	for i, e := range entries {
		dst = append(append(dst, e.Key...), '_')
		dst = append(append(dst, l.CounterValue(entries, i)...), '_')
	}
	return dst
}
