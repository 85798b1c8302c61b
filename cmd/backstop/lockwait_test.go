package main

import (
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/internal/redistest"
	"github.com/backstop-sync/backstop/sources/sim"
)

// lockWaitLease is governor.job_lease in these tests: what a job's first
// lock in a fresh Redis waits before the run begins.
const lockWaitLease = 3 * time.Second

// `backstop run` whose job's lock is new to Redis waits one job_lease
// before the run begins. Its progress lines used to say it waited for its
// first page, and its summary's duration left the wait out: they now say
// it waits for the job's lock, and the summary gives the wait on a line
// of its own. The next run, the lock's record in Redis, waits for nothing.
func TestRunJobSaysItWaitsForANewLock(t *testing.T) {
	t.Parallel()
	rds := redistest.Start(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 5, Objects: 40}})
	e.withJobs()
	e.appendConfig("governor:\n  redis: " + rds.URL() + "\n  job_lease: " + lockWaitLease.String() + "\n")
	run := func() (string, string) {
		t.Helper()
		cmd := exec.Command(binPath, "--config", e.config, "run", "crm-nightly")
		cmd.Env = append(e.environ(e.sim.APIKey()), "BACKSTOP_PROGRESS_INTERVAL=300ms")
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("run crm-nightly: %v\n%s%s", err, stdout.String(), stderr.String())
		}
		return stdout.String(), stderr.String()
	}

	stdout, stderr := run()
	if !strings.Contains(stderr, "waiting=\"for the job's lock, new to Redis") {
		t.Errorf("the progress lines of a run waiting for a new lock do not say so:\n%s", stderr)
	}
	// Once the wait is over, a line may say the run waits for its first
	// page (a loaded machine, a slow page): not before.
	if first := strings.Index(stderr, "for its first page"); first >= 0 && first < strings.LastIndex(stderr, "for the job's lock") {
		t.Errorf("a progress line says the run waits for its first page while it waits for its lock:\n%s", stderr)
	}
	if !strings.Contains(stdout, "lock wait") || !strings.Contains(stdout, "3s before the run began") {
		t.Errorf("the summary does not give the lock's wait:\n%s", stdout)
	}

	stdout, stderr = run()
	if strings.Contains(stdout, "lock wait") || strings.Contains(stderr, "for the job's lock") {
		t.Errorf("a run whose lock Redis has a record of says it waited for it:\n%s%s", stdout, stderr)
	}
}

// Run now from the dashboard, for a job whose lock is new to Redis,
// answered only once the run began, a job_lease later. It now answers at
// once that the run starts after the wait, and the run then runs.
func TestDashboardRunNowAnswersBeforeTheLockWait(t *testing.T) {
	t.Parallel()
	rds := redistest.Start(t)
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 6, Objects: 30}})
	e.writeServeConfig(addr, `jobs:
  - {name: crm-sync, kind: sync, resources: [contacts], cron: "0 3 * * *"}
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
governor:
  redis: `+rds.URL()+`
  job_lease: `+lockWaitLease.String()+`
`)
	stop := e.serveWithDashboard()
	defer stop()

	began := time.Now()
	code, body := dashboardPost(t, addr, "/ui/jobs/crm-sync/run", url.Values{})
	took := time.Since(began)
	if code != http.StatusAccepted || !strings.Contains(body, "starts in 3s") {
		t.Errorf("Run now with the job's lock new to Redis: %d %s; want 202 saying it starts in 3s", code, body)
	}
	if took >= lockWaitLease {
		t.Errorf("Run now answered after %s, want before the lock's wait (%s) is over", took, lockWaitLease)
	}
	deadline := time.Now().Add(stepTimeout)
	for {
		db := e.openStore()
		runs, err := db.JobRuns(t.Context(), "crm-sync", 0)
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(runs) == 1 && runs[0].Status == "ok" {
			if wait := runs[0].StartedAt.Sub(began); wait < lockWaitLease*9/10 {
				t.Errorf("the run began %s after Run now, want after the lock's wait (%s)", wait, lockWaitLease)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run asked for never finished: %+v", runs)
		}
		time.Sleep(50 * time.Millisecond) // polling the store, with a deadline
	}
}
