package config

// DropReplaced applies replaces across the rules that the descriptors of
// one request matched, as the reference does: a rule with a name that
// another matched rule replaces is set to nil, so that it neither counts
// nor reports. Every matched rule's replaces count, an unlimited rule's
// too. Unlimited rules themselves are left in place (the reference answers
// them OK whatever replaces them). limits holds one entry per descriptor,
// nil where none matched.
func DropReplaced(limits []*Limit) {
	var replaced map[string]bool
	for _, l := range limits {
		if l == nil {
			continue
		}
		for _, name := range l.Replaces {
			if replaced == nil {
				replaced = make(map[string]bool)
			}
			replaced[name] = true
		}
	}
	if replaced == nil {
		return
	}
	for i, l := range limits {
		if l != nil && !l.Unlimited && l.Name != "" && replaced[l.Name] {
			limits[i] = nil
		}
	}
}
