package main

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// Every configured job's backstop_job_last_run_timestamp_seconds series
// exist from serve's start, at 0 for a status it never ended with: a
// staleness alert on {status="ok"} found no series for a job that had
// never succeeded, and so never fired.
func TestJobMetricsLastRunSeriesExistFromTheStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newJobMetrics(reg)
	at := time.Unix(1_800_000_000, 0)
	m.seed([]string{"payments-hourly", "prune"}, []store.JobFinish{
		{Job: "payments-hourly", Status: "failed", FinishedAt: at},
		{Job: "gone", Status: "ok", FinishedAt: at},
	})
	got := lastRuns(t, reg)
	want := map[string]float64{"payments-hourly/failed": float64(at.Unix())}
	for _, job := range []string{"payments-hourly", "prune"} {
		for _, status := range jobRunStatuses {
			if _, ok := want[job+"/"+string(status)]; !ok {
				want[job+"/"+string(status)] = 0
			}
		}
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("last run %s: %v (present %v), want %v", k, g, ok, v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("last run %s exported, want only the configured jobs' statuses", k)
		}
	}
}

// The same through a real serve: a reconcile that has only failed has its
// {status="ok"} series at 0 on /metrics from the start.
func TestServeExportsNeverSucceededJobAtZero(t *testing.T) {
	addr := freeAddr(t)
	e := newServeEnv(t, addr, envOpts{sim: sim.Options{Seed: 1, Objects: 5}})
	e.appendConfig("jobs:\n  - {name: payments-hourly, kind: reconcile, resources: [payments], cron: \"0 3 31 12 *\"}\n" +
		"  - {name: prune, kind: maintenance, cron: \"30 4 31 12 *\"}\n")
	ctx := context.Background()
	at := time.Now().Add(-time.Hour).Truncate(time.Second)
	db := e.openStore()
	if _, err := db.SaveJobRun(ctx, store.JobRun{Job: "payments-hourly", Kind: "reconcile", StartedAt: at, FinishedAt: at,
		Status: "failed", Error: "platform unavailable"}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	p := startProc(t, "serve", e.config, e.sim.APIKey(), []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}, "serve")
	p.waitCount("msg=serving", 1, 30*time.Second)
	m := p.metrics()
	for series, want := range map[string]float64{
		`backstop_job_last_run_timestamp_seconds{job="payments-hourly",status="ok"}`:          0,
		`backstop_job_last_run_timestamp_seconds{job="payments-hourly",status="failed"}`:      float64(at.Unix()),
		`backstop_job_last_run_timestamp_seconds{job="payments-hourly",status="interrupted"}`: 0,
		`backstop_job_last_run_timestamp_seconds{job="payments-hourly",status="skipped"}`:     0,
		`backstop_job_last_run_timestamp_seconds{job="prune",status="ok"}`:                    0,
		`backstop_job_last_run_timestamp_seconds{job="prune",status="failed"}`:                0,
	} {
		if v, ok := m[series]; !ok || v != want {
			t.Errorf("%s at start: %v (present %v), want %v", series, v, ok, want)
		}
	}
}

// A standby serve (governor.redis) exported the last runs stored when it
// started, and then only its own, which it never has: an alert on the age
// of the last ok run fired on it while the leader ran the job on time.
// Every scrape now moves them on to the runs stored since.
func TestJobMetricsLastRunFollowsTheStore(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newJobMetrics(reg)
	at := time.Unix(1_800_000_000, 0)
	m.seed([]string{"payments-hourly"}, []store.JobFinish{{Job: "payments-hourly", Status: "ok", FinishedAt: at}})
	stored := []store.JobFinish{{Job: "payments-hourly", Status: "ok", FinishedAt: at.Add(time.Hour)}}
	m.readLast = func(context.Context) ([]store.JobFinish, error) { return stored, nil }
	lastOK := func() float64 {
		t.Helper()
		v, ok := lastRuns(t, reg)["payments-hourly/ok"]
		if !ok {
			t.Fatal("no last ok run of payments-hourly exported")
		}
		return v
	}
	if got, want := lastOK(), float64(at.Add(time.Hour).Unix()); got != want {
		t.Errorf("last ok run after another process's run = %v, want %v", got, want)
	}
	// An older stored time (a read racing a newer run of this process)
	// never moves it back.
	stored = []store.JobFinish{{Job: "payments-hourly", Status: "ok", FinishedAt: at}}
	if got, want := lastOK(), float64(at.Add(time.Hour).Unix()); got != want {
		t.Errorf("last ok run moved back to %v, want %v", got, want)
	}
}

// lastRuns gathers reg's backstop_job_last_run_timestamp_seconds by
// "job/status".
func lastRuns(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "backstop_job_last_run_timestamp_seconds" {
			continue
		}
		for _, s := range f.GetMetric() {
			var job, status string
			for _, l := range s.GetLabel() {
				switch l.GetName() {
				case "job":
					job = l.GetValue()
				case "status":
					status = l.GetValue()
				}
			}
			got[job+"/"+status] = s.GetGauge().GetValue()
		}
	}
	return got
}
