package config

import "google.golang.org/protobuf/types/known/structpb"

// The configuration as written, before its rules are checked: what the YAML
// reader and the xDS conversion both produce, so that one builder checks
// both the same way. Each part carries where it is written, for errors.

// rawDomain is one file's or one resource's domain.
type rawDomain struct {
	domain      string
	descriptors []rawDescriptor
	at          string // the domain's place
}

// rawDescriptor is one descriptor.
type rawDescriptor struct {
	key, value     string
	rateLimit      *rawRateLimit
	descriptors    []rawDescriptor
	shadowMode     bool
	quotaMode      bool
	detailedMetric bool
	valueToMetric  bool
	shareThreshold bool
	metadata       *structpb.Struct
	at             string // the descriptor's place
	shareAt        string // share_threshold's place
}

// rawRateLimit is a descriptor's rate_limit, with the extensions.
type rawRateLimit struct {
	unit            string
	hasUnit         bool
	requestsPerUnit uint32
	hasRequests     bool
	unlimited       bool
	name            string
	replaces        []rawReplace
	algorithm       string
	hasAlgorithm    bool
	burst           int64
	hasBurst        bool
	zone            string
	hasZone         bool

	at, unitAt, unlimitedAt, algorithmAt, burstAt, zoneAt string
}

// rawReplace is one entry of replaces.
type rawReplace struct {
	name string
	at   string
}

// place returns at, or fallback when at is empty (a key not written, whose
// mistake is then placed at what holds it).
func place(at, fallback string) string {
	if at != "" {
		return at
	}
	return fallback
}
