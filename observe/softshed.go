package observe

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// Soft shedding figures: the requests a soft-shedding token bucket zone
// delayed, and their delays. A dry-run zone counts the delays it would have
// asked; a request turned away by a full waiting room (max_waiting) was
// delayed by the decision and is counted too.

// shedDelayBuckets are the soft shed delay histogram's buckets, in
// seconds: from a millisecond to the default max delay and beyond.
var shedDelayBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// initShedMetrics creates the soft shed metrics, once (initMetrics).
func initShedMetrics() {
	metrics.shedDelayed = newCounterVec("soft_shed_delayed_total",
		"Requests the zone admitted and delayed because its key had used more than its soft_shed share of the burst (a dry-run zone: would have delayed).",
		"zone")
	metrics.shedDelay = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: metricsNamespace,
		Subsystem: metricsSubsystem,
		Name:      "soft_shed_delay_seconds",
		Help:      "The delays of the requests the zone's soft_shed delayed (a dry-run zone: would have delayed).",
		Buckets:   shedDelayBuckets,
	}, []string{"zone"})
}

// shedPercent returns the rule's soft shed percentage, 0 when it sheds
// no request softly.
func shedPercent(r *limiter.Rule) int64 {
	pct, _ := r.SoftShed()
	return pct
}

// shed counts a request the zone delayed by d.
func (z *zoneStats) shed(d time.Duration) {
	z.shedDelayed.Add(1)
	z.shedDelayUS.Add(uint64(d / time.Microsecond))
	z.series.shedDelayed.Inc()
	z.series.shedDelay.Observe(d.Seconds())
}

// statsSoftShed is a soft-shedding zone's figures on this node: its
// threshold (Percent of the burst) and longest delay, how many requests it
// delayed and their delays' sum, in seconds, since the zone entered the
// configuration.
type statsSoftShed struct {
	Percent      int64   `json:"percent"`
	MaxDelay     string  `json:"max_delay"`
	Delayed      uint64  `json:"delayed"`
	DelaySeconds float64 `json:"delay_seconds"`
}

// softShedDocument reports the zone's soft shed as info configures it, nil
// when it sheds no request softly.
func (z *zoneStats) softShedDocument(info *zoneInfo) *statsSoftShed {
	if info == nil || info.shedPct == 0 {
		return nil
	}
	return &statsSoftShed{
		Percent:      info.shedPct,
		MaxDelay:     info.maxDelay.String(),
		Delayed:      z.shedDelayed.Load(),
		DelaySeconds: float64(z.shedDelayUS.Load()) / 1e6,
	}
}
