package limiter

// One store call in flight per key and node: a request that its node's
// spares do not cover asks the store about the key, and takes spares; the
// node's other requests of the key that come meanwhile wait for that
// answer (its spares, or its pause) instead of asking too. Without this,
// every request in flight when a node's spares run out made its own store
// call and took its own spares: under a burst a few nodes drained the
// bucket into spares that others could not use, and a busy node made about
// as many store calls as without prefetch.

// spareFlight is the keys one request claimed, to land when its decision is
// kept.
type spareFlight struct {
	keys [4]spareKey
	n    int
	more []spareKey // beyond the fourth
}

// add claims k.
func (f *spareFlight) add(k spareKey) {
	if f.n < len(f.keys) {
		f.keys[f.n] = k
		f.n++
		return
	}
	f.more = append(f.more, k)
}

// land ends the store calls f claimed, waking the requests waiting for
// them.
func (s *spares) land(f *spareFlight) {
	if f.n == 0 && len(f.more) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range f.keys[:f.n] {
		s.end(k)
	}
	for _, k := range f.more {
		s.end(k)
	}
	f.n, f.more = 0, f.more[:0]
}

// end closes and forgets the spareFlight of k; the holder is locked.
func (s *spares) end(k spareKey) {
	if ch := s.flights[k]; ch != nil {
		close(ch)
		delete(s.flights, k)
	}
}
