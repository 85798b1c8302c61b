package intake

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// RequestOutcomes are the outcome label values of
// backstop_intake_requests_total.
var RequestOutcomes = []string{"accepted", "duplicate", "bad_signature", "malformed", "too_large",
	"unsupported_media_type", "method_not_allowed", "draining", "store_error", "timeout", outcomeSenderGone}

// outcomeSenderGone counts a webhook whose sender closed its connection
// while the event waited for its commit: it got no answer.
const outcomeSenderGone = "sender_gone"

// Metrics are the intake's Prometheus collectors. Register them on the
// registry /metrics serves.
type Metrics struct {
	Requests          *prometheus.CounterVec
	Duplicates        prometheus.Counter
	SignatureFailures prometheus.Counter
	BatchSize         prometheus.Histogram
	CommitLatency     prometheus.Histogram
	CommitErrors      prometheus.Counter
	TruncatedFetches  *prometheus.CounterVec
	TruncatedPending  prometheus.Gauge

	// failed holds the error of the last commit when it failed; nil once
	// a commit has succeeded since (see CommitFailure).
	failed atomic.Pointer[commitFailure]
}

// commitFailure is a failed commit's error, boxed for atomic.Pointer.
type commitFailure struct{ err error }

// NewMetrics creates the collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "backstop_intake_requests_total",
			Help: "Webhook requests by outcome (accepted, duplicate, bad_signature, malformed, too_large, unsupported_media_type, method_not_allowed, draining, store_error, timeout).",
		}, []string{"outcome"}),
		Duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "backstop_intake_duplicates_total",
			Help: "Events suppressed as duplicates of an event already processed.",
		}),
		SignatureFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "backstop_intake_signature_failures_total",
			Help: "Webhook requests refused for a bad or missing signature.",
		}),
		BatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "backstop_emit_commit_batch_size",
			Help:    "Events per emit-path commit (group commit).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512},
		}),
		CommitLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "backstop_emit_commit_seconds",
			Help:    "Duration of emit-path commits.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		CommitErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "backstop_emit_commit_errors_total",
			Help: "Emit-path commits that failed.",
		}),
		TruncatedFetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "backstop_truncated_fetches_total",
			Help: "Fetches of truncated events' objects by result (ok, error, gave_up: the platform has no such object).",
		}, []string{"result"}),
		TruncatedPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "backstop_truncated_pending",
			Help: "Truncated events whose object is still to be fetched.",
		}),
	}
	reg.MustRegister(m.Requests, m.Duplicates, m.SignatureFailures, m.BatchSize, m.CommitLatency,
		m.CommitErrors, m.TruncatedFetches, m.TruncatedPending)
	// The fetch results and request outcomes are exported at zero from
	// the start, so that a scrape (and a rate() over it, or an alert on
	// store_error) sees every series before its first event, and the
	// first burst of errors after a restart is not lost in a series
	// that has only just appeared.
	for _, r := range []string{"ok", "error", "gave_up"} {
		m.TruncatedFetches.WithLabelValues(r)
	}
	for _, o := range RequestOutcomes {
		m.Requests.WithLabelValues(o)
	}
	return m
}

// ObserveCommit records one commit of the group-commit writer.
func (m *Metrics) ObserveCommit(size int, took time.Duration, err error) {
	if m == nil {
		return
	}
	m.BatchSize.Observe(float64(size))
	m.CommitLatency.Observe(took.Seconds())
	if err != nil {
		m.CommitErrors.Inc()
		m.failed.Store(&commitFailure{err})
	} else if m.failed.Load() != nil {
		m.failed.Store(nil)
	}
}

// CommitFailure returns the error of the emit path's last commit when it
// failed, and nil when it succeeded (or none was made), so that a
// readiness probe can tell a store that no longer takes commits (a full
// disk) from one that merely answers.
func (m *Metrics) CommitFailure() error {
	if m == nil {
		return nil
	}
	if f := m.failed.Load(); f != nil {
		return f.err
	}
	return nil
}

// CommitRecovered forgets the failure CommitFailure returned as failed,
// once something else (a probe's own write) has shown that the store
// commits again; a later failure is kept.
func (m *Metrics) CommitRecovered(failed error) {
	if m == nil {
		return
	}
	if f := m.failed.Load(); f != nil && f.err == failed {
		m.failed.CompareAndSwap(f, nil)
	}
}
