package rls

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// bounds are the most a call may ask for; a call beyond them is refused
// with INVALID_ARGUMENT before anything is matched or charged.
type bounds struct {
	descriptors int // descriptors per call
	entries     int // entries per descriptor
	entryBytes  int // bytes of an entry's key or value
}

// The bounds' defaults (App.MaxDescriptors, MaxEntries, MaxEntryBytes).
const (
	defaultMaxDescriptors = 64
	defaultMaxEntries     = 16
	defaultMaxEntryBytes  = 4096
)

// maxHits is the largest hits_addend a call may give (the request's or a
// descriptor's): 2^31-1, so that a count that a signed 32-bit or 64-bit
// counter would read as negative is refused rather than taken as huge.
const maxHits = 1<<31 - 1

// bounds returns the app's bounds, defaults applied.
func (a *App) bounds() bounds {
	b := bounds{descriptors: a.MaxDescriptors, entries: a.MaxEntries, entryBytes: a.MaxEntryBytes}
	if b.descriptors == 0 {
		b.descriptors = defaultMaxDescriptors
	}
	if b.entries == 0 {
		b.entries = defaultMaxEntries
	}
	if b.entryBytes == 0 {
		b.entryBytes = defaultMaxEntryBytes
	}
	return b
}

// check refuses a call that the reference refuses (an empty domain, no
// descriptors) or that goes beyond the bounds, with INVALID_ARGUMENT and a
// message that says which part is at fault (never the values themselves).
func (b bounds) check(req *rlsv3.RateLimitRequest) error {
	switch n := len(req.GetDescriptors()); {
	case req.GetDomain() == "":
		return status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	case n == 0:
		return status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	case n > b.descriptors:
		return status.Errorf(codes.InvalidArgument, "%d descriptors in one call; at most %d", n, b.descriptors)
	case len(req.GetDomain()) > b.entryBytes:
		return status.Errorf(codes.InvalidArgument, "the domain is %d bytes; at most %d", len(req.GetDomain()), b.entryBytes)
	case req.GetHitsAddend() > maxHits:
		return status.Errorf(codes.InvalidArgument, "hits_addend %d is above %d", req.GetHitsAddend(), maxHits)
	}
	for i, d := range req.GetDescriptors() {
		if n := len(d.GetEntries()); n > b.entries {
			return status.Errorf(codes.InvalidArgument, "descriptor %d has %d entries; at most %d", i, n, b.entries)
		}
		for j, e := range d.GetEntries() {
			if len(e.GetKey()) > b.entryBytes || len(e.GetValue()) > b.entryBytes {
				return status.Errorf(codes.InvalidArgument, "descriptor %d, entry %d: key or value longer than %d bytes", i, j, b.entryBytes)
			}
		}
		if h := d.GetHitsAddend(); h != nil && h.GetValue() > maxHits {
			return status.Errorf(codes.InvalidArgument, "descriptor %d: hits_addend %d is above %d", i, h.GetValue(), maxHits)
		}
	}
	return nil
}

// hitsOf returns what descriptor i of req charges: its own hits_addend
// when set (0 checks without charging), else the request's, where 0
// counts as 1 (as the reference reads them).
func hitsOf(req *rlsv3.RateLimitRequest, i int) int64 {
	if h := req.Descriptors[i].GetHitsAddend(); h != nil {
		return int64(h.GetValue())
	}
	return int64(max(1, req.GetHitsAddend()))
}
