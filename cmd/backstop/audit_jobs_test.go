package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/backstop-sync/backstop/sources/sim"
)

// jobsJSON runs `backstop jobs --json` and returns the job named name.
func (e *env) jobsJSON(name string) jobRow {
	e.t.Helper()
	code, stdout, stderr := e.run(context.Background(), "jobs", "--json")
	if code != exitOK {
		e.t.Fatalf("jobs --json: exit %d\n%s", code, stderr)
	}
	var rows []jobRow
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
		e.t.Fatalf("jobs --json: %v\n%s", err, stdout)
	}
	for _, r := range rows {
		if r.Name == name {
			return r
		}
	}
	e.t.Fatalf("jobs --json lists no %s:\n%s", name, stdout)
	return jobRow{}
}

// A `backstop run JOB` killed with SIGKILL mid-run leaves its run stored
// as running (with a heartbeat), which `backstop jobs` shows; once its
// heartbeat is older than any live run's could be, maintenance closes it
// as abandoned. It used to leave no trace at all.
func TestKilledJobRunIsShownRunningThenAbandoned(t *testing.T) {
	e := newEnv(t, envOpts{
		sim:       sim.Options{Seed: 13, Objects: 1500, Limit: 60, Window: time.Second},
		perMinute: 3600, window: "1s", pageSize: 10,
	})
	e.withJobs()
	cmd, lines := e.startBinary("--log-level", "debug", "run", "crm-nightly")
	waitLines(t, lines, "page committed", 3, time.Minute)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	last := e.jobsJSON("crm-nightly").LastRun
	if last == nil || last.Status != "running" || last.FinishedAt != nil || last.HeartbeatAt == nil ||
		last.HeartbeatAt.Before(last.StartedAt) {
		t.Fatalf("backstop jobs after the kill: last run %+v, want it running with a heartbeat", last)
	}
	// Right away it might be a run going on in another process:
	// maintenance leaves it.
	if code, _, stderr := e.run(context.Background(), "run", "prune"); code != exitOK {
		t.Fatalf("run prune: exit %d\n%s", code, stderr)
	}
	if last := e.jobsJSON("crm-nightly").LastRun; last == nil || last.Status != "running" {
		t.Fatalf("a run that beat moments ago was closed: %+v", last)
	}

	// Two hours later (its times moved back), maintenance closes it.
	raw, err := sql.Open("sqlite", e.db+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	old := time.Now().Add(-2 * time.Hour).UTC().Format("2006-01-02T15:04:05.000000000Z")
	if res, err := raw.Exec(`UPDATE job_runs SET heartbeat_at = ?, started_at = ? WHERE status = 'running' AND job = 'crm-nightly'`, old, old); err != nil {
		t.Fatal(err)
	} else if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("%d running runs of crm-nightly, want 1", n)
	}
	if code, _, stderr := e.run(context.Background(), "run", "prune"); code != exitOK {
		t.Fatalf("run prune: exit %d\n%s", code, stderr)
	}
	last = e.jobsJSON("crm-nightly").LastRun
	if last == nil || last.Status != "abandoned" || last.FinishedAt == nil || last.Error == "" {
		t.Errorf("killed run two hours later, after maintenance: %+v, want abandoned with its reason", last)
	}
	// The next run completes from the saved cursor.
	if code, _, stderr := e.run(context.Background(), "run", "crm-nightly"); code != exitOK {
		t.Fatalf("next run: exit %d\n%s", code, stderr)
	}
	if last := e.jobsJSON("crm-nightly").LastRun; last == nil || last.Status != "ok" {
		t.Errorf("after the next run: %+v, want ok", last)
	}
}
