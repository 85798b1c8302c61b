package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/internal/redistest"
	"github.com/backstop-sync/backstop/sources/sim"
	bsync "github.com/backstop-sync/backstop/sync"
)

// withJobs rewrites e's configuration with a target subscribed to contact
// events and the three example jobs plus a broken one.
func (e *env) withJobs() {
	e.t.Helper()
	base, err := os.ReadFile(e.config)
	if err != nil {
		e.t.Fatal(err)
	}
	e.writeConfig(string(base) + `targets:
  - name: crm
    url: http://127.0.0.1:9/hook
    allow_private: true
    events: ["contact.*"]
jobs:
  - name: crm-nightly
    kind: sync
    resources: [contacts]
    cron: "0 3 * * *"
  - name: payments-hourly
    kind: reconcile
    resources: [payments]
    cron: "0 * * * *"
    lookback: 10m
  - name: prune
    kind: maintenance
    cron: "30 4 * * *"
`)
}

func TestRunJobExitCodes(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 3, Objects: 25}})
	e.withJobs()
	ctx := context.Background()

	code, stdout, stderr := e.run(ctx, "run", "crm-nightly")
	if code != exitOK {
		t.Fatalf("run crm-nightly: exit %d, want 0\n%s", code, stderr)
	}
	want := len(e.sim.Objects(backstop.Contacts))
	for _, line := range []string{"result", "ok", "new", fmt.Sprint(want), "emitted"} {
		if !strings.Contains(stdout, line) {
			t.Errorf("counts do not show %q:\n%s", line, stdout)
		}
	}

	if code, _, stderr := e.run(ctx, "run", "no-such-job"); code != exitUsage || !strings.Contains(stderr, "no-such-job") {
		t.Errorf("unknown job: exit %d, want 2 naming it\n%s", code, stderr)
	}
	// A typo is told as one, also where the API key is not set (it said
	// "source.api_key is empty: set BOTIX_API_KEY").
	code, _, stderr = runBinary(t, t.TempDir(), e.environ(""), "--config", e.config, "run", "crm-nighty")
	if want := "run crm-nighty: no such job in " + e.config + ": did you mean crm-nightly? (see backstop jobs)"; code != exitUsage || !strings.Contains(stderr, want) {
		t.Errorf("a mistyped job without the API key: exit %d %s; want 2 and %q", code, stderr, want)
	}
	if code, _, stderr := e.run(ctx, "run"); code != exitUsage {
		t.Errorf("no job named: exit %d, want 2\n%s", code, stderr)
	}

	code, stdout, stderr = e.runKey(ctx, "wrong-key", "run", "payments-hourly", "--json")
	if code != exitFailure {
		t.Fatalf("wrong key: exit %d, want 1\n%s", code, stderr)
	}
	var run struct {
		Status string `json:"status"`
		Error  string `json:"error"`
	}
	if err := json.Unmarshal([]byte(stdout), &run); err != nil {
		t.Fatalf("--json: %v\n%s", err, stdout)
	}
	if run.Status != "failed" || !strings.Contains(run.Error, "unauthorized") {
		t.Errorf("failed run printed as %+v", run)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if code, _, stderr := e.run(cctx, "run", "crm-nightly"); code != exitInterrupted {
		t.Errorf("interrupted: exit %d, want 130\n%s", code, stderr)
	}

	// Every run was stored, the failed one with its error.
	db := e.openStore()
	runs, err := db.JobRuns(ctx, "payments-hourly", 0)
	if err != nil || len(runs) != 1 || runs[0].Status != "failed" || runs[0].Error == "" {
		t.Errorf("payments-hourly runs = %+v, %v; want one failed run with its error", runs, err)
	}
}

// A sync job emits its changes: processed events with origin sync and one
// outbox row per change for the matching target.
func TestRunSyncJobEmits(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 4, Objects: 30}})
	e.withJobs()
	ctx := context.Background()
	if code, _, stderr := e.run(ctx, "run", "crm-nightly"); code != exitOK {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	db := e.openStore()
	contacts := e.sim.Objects(backstop.Contacts)
	for _, o := range contacts {
		id := backstop.EventID(backstop.DedupKey(backstop.Contacts, o.ID, o.UpdatedAt))
		pe, ok, err := db.ProcessedEvent(ctx, id)
		if err != nil || !ok || pe.Origin != backstop.OriginSync {
			t.Fatalf("%s: processed event %+v ok=%v err=%v, want origin sync", o.ID, pe, ok, err)
		}
	}
	rows, err := db.OutboxRows(ctx, "crm")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(contacts) {
		t.Errorf("%d outbox rows for crm, want %d", len(rows), len(contacts))
	}
	for _, r := range rows {
		if !strings.HasPrefix(r.EventType, "contact.") || !strings.Contains(string(r.Payload), `"origin":"sync"`) {
			t.Errorf("outbox row %s %s: %s", r.EventType, r.EventID, r.Payload)
			break
		}
	}
	e.assertMirrorEqualsSim(backstop.Contacts)
}

func TestJobsJSONListsNextAndLastRun(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 5, Objects: 10}})
	e.withJobs()
	ctx := context.Background()
	// A maintenance job is refused on a store.path with no database.
	e.openStore().Close()
	if code, _, stderr := e.run(ctx, "run", "prune"); code != exitOK {
		t.Fatalf("run prune: exit %d\n%s", code, stderr)
	}
	before := time.Now()
	code, stdout, stderr := e.run(ctx, "jobs", "--json")
	if code != exitOK {
		t.Fatalf("jobs: exit %d\n%s", code, stderr)
	}
	var rows []struct {
		Name     string    `json:"name"`
		Kind     string    `json:"kind"`
		Schedule string    `json:"schedule"`
		NextRun  time.Time `json:"next_run"`
		LastRun  *struct {
			Status string `json:"status"`
		} `json:"last_run"`
	}
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	if len(rows) != 3 {
		t.Fatalf("%d jobs listed, want 3:\n%s", len(rows), stdout)
	}
	want := map[string]struct{ kind, schedule string }{
		"crm-nightly":     {"sync", "cron 0 3 * * *"},
		"payments-hourly": {"reconcile", "cron 0 * * * *"},
		"prune":           {"maintenance", "cron 30 4 * * *"},
	}
	for _, r := range rows {
		w, ok := want[r.Name]
		if !ok || r.Kind != w.kind || r.Schedule != w.schedule {
			t.Errorf("job %+v, want %+v", r, w)
		}
		if !r.NextRun.After(before) || r.NextRun.After(before.Add(25*time.Hour)) {
			t.Errorf("%s: next run %v, want within a day after %v", r.Name, r.NextRun, before)
		}
		if r.Name == "payments-hourly" && r.NextRun.Minute() != 0 {
			t.Errorf("payments-hourly next run %v is not on the hour", r.NextRun)
		}
		switch {
		case r.Name == "prune" && (r.LastRun == nil || r.LastRun.Status != "ok"):
			t.Errorf("prune: last run %+v, want ok", r.LastRun)
		case r.Name != "prune" && r.LastRun != nil:
			t.Errorf("%s: last run %+v, want none", r.Name, r.LastRun)
		}
	}
	code, stdout, _ = e.run(ctx, "jobs")
	if code != exitOK || !strings.Contains(stdout, "NEXT RUN") || !strings.Contains(stdout, "crm-nightly") {
		t.Errorf("jobs table: exit %d\n%s", code, stdout)
	}
}

// serve runs the configured jobs on their schedule and stops them on
// shutdown, before closing the store.
func TestServeRunsScheduledJobs(t *testing.T) {
	addr := freeAddr(t)
	e := newServeEnv(t, addr, envOpts{sim: sim.Options{Seed: 6, Objects: 20}})
	base, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	e.writeConfig(string(base) + `jobs:
  - name: contacts-often
    kind: sync
    resources: [contacts]
    every: 1s
`)
	t.Setenv("BOTIX_WEBHOOK_SECRET", webhookSecret)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		code, _, stderr := e.run(ctx, "serve")
		if code != exitOK {
			t.Errorf("serve: exit %d\n%s", code, stderr)
		}
		done <- code
	}()
	db := e.openStore()
	deadline := time.Now().Add(20 * time.Second)
	for {
		runs, err := db.JobRuns(ctx, "contacts-often", 0)
		if err != nil {
			t.Fatal(err)
		}
		ok := 0
		for _, r := range runs {
			if r.Status == "ok" {
				ok++
			}
		}
		if ok >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve ran the job %d times in 20s: %+v", ok, runs)
		}
		select {
		case <-time.After(10 * time.Millisecond): // polling the store, with a deadline
		case code := <-done:
			t.Fatalf("serve exited early with %d", code)
		}
	}
	// Job runs are exported on /metrics.
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(body), `backstop_job_runs_total{job="contacts-often",status="ok"}`) {
		t.Errorf("/metrics has no job runs:\n%s", body)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
	e.assertMirrorEqualsSim(backstop.Contacts)
}

// `backstop run` of a job that is running in another process (its Redis
// lock held) is stored as skipped, prints the stored run's id, and exits
// 75 (exitBusy), saying why: it used to exit 0, and a cron wrapper took
// the job for run (found by a fleet audit). The lock holds an old-form
// token, which names no holder.
func TestRunJobSkippedWhileRunningElsewhere(t *testing.T) {
	rds := redistest.Start(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 3, Objects: 5}})
	e.withJobs()
	base, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	e.writeConfig(string(base) + "governor:\n  redis: " + rds.URL() + "\n")
	rdb := redis.NewClient(&redis.Options{Addr: rds.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	// The lock's key, as the scheduler names it (see jobLockPrefix).
	idb := e.openStore()
	storeID, err := idb.StoreID(ctx)
	idb.Close()
	if err != nil {
		t.Fatal(err)
	}
	key := bsync.DefaultJobLockPrefix + storeID + ":crm-nightly"
	if err := rdb.Set(ctx, key, "another-process", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := e.run(ctx, "run", "crm-nightly", "--json")
	if code != exitBusy {
		t.Fatalf("run while running elsewhere: exit %d, want %d\n%s%s", code, exitBusy, stdout, stderr)
	}
	var run struct {
		ID     int64  `json:"id"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal([]byte(stdout), &run); err != nil {
		t.Fatalf("--json: %v\n%s", err, stdout)
	}
	db := e.openStore()
	defer db.Close()
	runs, err := db.JobRuns(ctx, "crm-nightly", 0)
	if err != nil || len(runs) != 1 || runs[0].Status != "skipped" {
		t.Fatalf("stored runs %+v (%v), want one skipped", runs, err)
	}
	if run.Status != "skipped" || run.ID != runs[0].ID {
		t.Errorf("printed %+v, want status skipped and the stored id %d", run, runs[0].ID)
	}
	if want := "backstop: run crm-nightly: skipped: job crm-nightly: job is still running in another process"; !strings.Contains(stderr, want) {
		t.Errorf("stderr does not say why the run was skipped:\n%s\nwant %q", stderr, want)
	}
}
