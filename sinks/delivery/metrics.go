package delivery

import "github.com/prometheus/client_golang/prometheus"

// metrics are the dispatcher's Prometheus collectors.
type metrics struct {
	depth       *prometheus.GaugeVec
	attempts    *prometheus.CounterVec
	deadLetters *prometheus.CounterVec
	unrecorded  *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	request     *prometheus.HistogramVec
	paused      prometheus.Gauge
	disabled    prometheus.Gauge
}

// newMetrics creates the collectors and registers them on reg when it is
// not nil.
func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "backstop_delivery_queue_depth",
			Help: "Deliveries waiting (pending or retrying) per target, counted at most once a second.",
		}, []string{"target"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "backstop_delivery_attempts_total",
			Help: "Delivery attempts by target and outcome (delivered, retrying, dead_letter, redirect).",
		}, []string{"target", "outcome"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "backstop_delivery_dead_letters_total",
			Help: "Deliveries dead-lettered, by target.",
		}, []string{"target"}),
		unrecorded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "backstop_delivery_record_failures_total",
			Help: "Answered attempts whose outcome could not be recorded, by target: the row stays leased and is sent again once its lease ends.",
		}, []string{"target"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "backstop_delivery_latency_seconds",
			Help:    "Time from queueing to successful delivery, by target.",
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 14), // 5 ms to 3.9 days: past the default retry schedule (about 25 h)
		}, []string{"target"}),
		request: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "backstop_delivery_request_seconds",
			Help:    "Duration of each delivery attempt's HTTP exchange, by target.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"target"}),
		paused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "backstop_delivery_paused_targets",
			Help: "Targets paused by a 429 Retry-After.",
		}),
		disabled: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "backstop_delivery_disabled_targets",
			Help: "Targets disabled (after a 410) until re-enabled.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.depth, m.attempts, m.deadLetters, m.unrecorded, m.latency, m.request, m.paused, m.disabled)
	}
	return m
}

// targetMetrics are one target's collectors, looked up once.
type targetMetrics struct {
	depth            prometheus.Gauge
	attempts         map[string]prometheus.Counter // by outcome
	deadLetters      prometheus.Counter
	unrecorded       prometheus.Counter
	latency, request prometheus.Observer
}

// target returns the collectors of target name.
func (m *metrics) target(name string) targetMetrics {
	tm := targetMetrics{
		depth:       m.depth.WithLabelValues(name),
		attempts:    map[string]prometheus.Counter{},
		deadLetters: m.deadLetters.WithLabelValues(name),
		unrecorded:  m.unrecorded.WithLabelValues(name),
		latency:     m.latency.WithLabelValues(name),
		request:     m.request.WithLabelValues(name),
	}
	for _, outcome := range []string{StatusDelivered, StatusRetrying, StatusDeadLetter, "redirect"} {
		tm.attempts[outcome] = m.attempts.WithLabelValues(name, outcome)
	}
	return tm
}

// attempt returns the attempts counter of outcome.
func (tm targetMetrics) attempt(outcome string) prometheus.Counter {
	return tm.attempts[outcome]
}
