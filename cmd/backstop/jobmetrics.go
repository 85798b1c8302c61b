package main

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/backstop-sync/backstop/store"
	bsync "github.com/backstop-sync/backstop/sync"
)

// jobCountNames are the count label values of backstop_job_objects_total.
var jobCountNames = []string{"new", "updated", "missing", "behind", "reemitted", "suppressed", "pruned", "orphans"}

// jobRunStatuses are the status label values of backstop_job_runs_total.
var jobRunStatuses = []bsync.JobStatus{bsync.JobOK, bsync.JobFailed, bsync.JobInterrupted, bsync.JobSkipped}

// jobMetrics exports every job run's result and counts (reconciliation
// reports included) on /metrics.
type jobMetrics struct {
	runs        *prometheus.CounterVec
	objects     *prometheus.CounterVec
	requests    *prometheus.CounterVec
	rateLimited *prometheus.CounterVec
	lastRun     *prometheus.GaugeVec
	duration    *prometheus.HistogramVec

	// readLast, when set, reads when each job last finished with each
	// status from the store (store.DB.LastJobFinishes): lastRun follows
	// it at every scrape, so that a process that does not run the jobs
	// (a standby under governor.redis) exports the leader's runs.
	readLast func(context.Context) ([]store.JobFinish, error)
	mu       sync.Mutex
	jobs     map[string]bool       // the configured jobs (seed)
	last     map[[2]string]float64 // lastRun's values by job and status
}

// lastRunGauge is jobMetrics.lastRun, refreshed from the store
// (jobMetrics.readLast) as it is collected.
type lastRunGauge struct{ m *jobMetrics }

func (g lastRunGauge) Describe(ch chan<- *prometheus.Desc) { g.m.lastRun.Describe(ch) }

func (g lastRunGauge) Collect(ch chan<- prometheus.Metric) {
	g.m.refreshLast()
	g.m.lastRun.Collect(ch)
}

// lastReadTimeout bounds the store read of a scrape (refreshLast).
const lastReadTimeout = 2 * time.Second

// refreshLast moves lastRun forward to the runs stored since (readLast);
// a read that fails leaves it as it was.
func (m *jobMetrics) refreshLast() {
	if m.readLast == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), lastReadTimeout)
	defer cancel()
	last, err := m.readLast(ctx)
	if err != nil {
		return
	}
	for _, f := range last {
		m.setLast(f.Job, f.Status, f.FinishedAt)
	}
}

// setLast sets when job last finished with status to at, unless it is
// known to have finished so later, or is not configured.
func (m *jobMetrics) setLast(job, status string, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.jobs[job] {
		return
	}
	k, v := [2]string{job, status}, float64(at.Unix())
	if v > m.last[k] {
		m.last[k] = v
		m.lastRun.WithLabelValues(job, status).Set(v)
	}
}

func newJobMetrics(reg prometheus.Registerer) *jobMetrics {
	m := &jobMetrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "backstop_job_runs_total",
			Help: "Job runs by job and status (ok, failed, interrupted: stopped by a signal or a lost lease, skipped: still running when due).",
		}, []string{"job", "status"}),
		objects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "backstop_job_objects_total",
			Help: "What job runs counted: new, updated, missing, behind, reemitted, suppressed (reconcile reports), pruned, orphans (full reconciles).",
		}, []string{"job", "count"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "backstop_job_api_requests_total",
			Help: "Platform API requests made by job runs.",
		}, []string{"job"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "backstop_job_api_rate_limited_total",
			Help: "429 answers job runs received.",
		}, []string{"job"}),
		lastRun: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "backstop_job_last_run_timestamp_seconds",
			Help: "When each job last finished, by status, in Unix seconds (0: no such run stored).",
		}, []string{"job", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "backstop_job_duration_seconds",
			Help:    "How long job runs that ran (ok, failed or interrupted) took, by job.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9), // 1 s to 18 h
		}, []string{"job"}),
	}
	m.jobs, m.last = map[string]bool{}, map[[2]string]float64{}
	reg.MustRegister(m.runs, m.objects, m.requests, m.rateLimited, lastRunGauge{m}, m.duration)
	return m
}

// seed exports every job of jobs before it runs in this process: its
// counters at zero (so that increase() and absent() see them from the
// start), when it last finished with each status of jobRunStatuses at
// zero (so that an alert on the age of a job's last successful run,
// time() - backstop_job_last_run_timestamp_seconds{status="ok"}, fires
// for a job that never succeeded instead of finding no series) and, from
// last (the runs stored before serve started, by this process's
// predecessors or by backstop run), when it last finished with each
// status, so that an alert on a nightly job's age does not go blind for a
// day after each restart. Stored runs of jobs no longer configured are
// left out. With readLast set, every scrape moves the last-run times on
// to the runs stored since, by whichever process ran them.
func (m *jobMetrics) seed(jobs []string, last []store.JobFinish) {
	if m == nil {
		return
	}
	m.mu.Lock()
	for _, job := range jobs {
		m.jobs[job] = true
	}
	m.mu.Unlock()
	for _, job := range jobs {
		for _, status := range jobRunStatuses {
			m.runs.WithLabelValues(job, string(status))
			m.lastRun.WithLabelValues(job, string(status))
		}
		for _, name := range jobCountNames {
			m.objects.WithLabelValues(job, name)
		}
		m.requests.WithLabelValues(job)
		m.rateLimited.WithLabelValues(job)
		m.duration.WithLabelValues(job)
	}
	for _, f := range last {
		m.setLast(f.Job, f.Status, f.FinishedAt)
	}
}

func (m *jobMetrics) observe(run bsync.JobRun) {
	if m == nil {
		return
	}
	status := string(run.Status)
	m.runs.WithLabelValues(run.Job, status).Inc()
	m.mu.Lock()
	m.jobs[run.Job] = true // it runs, so it is configured
	m.mu.Unlock()
	m.setLast(run.Job, status, run.FinishedAt)
	if run.Status != bsync.JobSkipped && !run.StartedAt.IsZero() && !run.FinishedAt.Before(run.StartedAt) {
		m.duration.WithLabelValues(run.Job).Observe(run.FinishedAt.Sub(run.StartedAt).Seconds())
	}
	c := run.Counts
	for name, v := range map[string]int64{
		"new": int64(c.New), "updated": int64(c.Updated), "missing": int64(c.Missing), "behind": int64(c.Behind),
		"reemitted": int64(c.Reemitted), "suppressed": int64(c.Suppressed), "pruned": c.Pruned,
	} {
		m.objects.WithLabelValues(run.Job, name).Add(float64(v))
	}
	if c.Orphans != nil {
		m.objects.WithLabelValues(run.Job, "orphans").Add(float64(*c.Orphans))
	}
	m.requests.WithLabelValues(run.Job).Add(float64(c.Requests))
	m.rateLimited.WithLabelValues(run.Job).Add(float64(c.RateLimited))
}
