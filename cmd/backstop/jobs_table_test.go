package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// jobsTableRow returns the header and the row of job name in the table of
// `backstop jobs`.
func jobsTableRow(t *testing.T, e *env, name string) (header, row string) {
	t.Helper()
	code, stdout, stderr := e.run(context.Background(), "jobs")
	if code != exitOK {
		t.Fatalf("jobs: exit %d\n%s", code, stderr)
	}
	lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	for _, l := range lines[1:] {
		if strings.HasPrefix(l, name+" ") {
			return lines[0], l
		}
	}
	t.Fatalf("jobs lists no %s:\n%s", name, stdout)
	return "", ""
}

// The table of `backstop jobs` showed only "failed" for a failed run; why
// it failed was in --json only. RESULT now holds the start of the error,
// on one line and cut to a width that keeps the table readable; --json
// keeps the whole error.
func TestJobsTableShowsWhyTheLastRunFailed(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.appendConfig(`jobs:
  - {name: payments-hourly, kind: reconcile, resources: [payments], cron: "0 * * * *"}
  - {name: crm-nightly, kind: sync, resources: [contacts], cron: "0 3 * * *"}
  - {name: prune, kind: maintenance, cron: "30 4 * * *"}
  - {name: short, kind: sync, resources: [chats], cron: "0 5 * * *"}
  - {name: killed, kind: sync, resources: [messages], cron: "0 6 * * *"}
`)
	ctx := context.Background()
	now := time.Now().Add(-time.Minute)
	long := "reconcile: payments: platform unavailable: dial tcp 127.0.0.1:1: connect: connection refused\n" +
		"\tafter 5 retries"
	db := e.openStore()
	for _, run := range []store.JobRun{
		{Job: "payments-hourly", Kind: "reconcile", StartedAt: now, FinishedAt: now, Status: "failed", Error: long},
		{Job: "crm-nightly", Kind: "sync", StartedAt: now, FinishedAt: now, Status: "interrupted", Error: "context canceled"},
		{Job: "prune", Kind: "maintenance", StartedAt: now, FinishedAt: now, Status: "ok"},
		{Job: "short", Kind: "sync", StartedAt: now, FinishedAt: now, Status: "failed", Error: "sync: chats: HTTP 401"},
		// Made abandoned below: its error starts with its status already.
		{Job: "killed", Kind: "sync", StartedAt: now, FinishedAt: now, Status: "failed",
			Error: "abandoned: no heartbeat since 12:00 (killed)"},
	} {
		if _, err := db.SaveJobRun(ctx, run); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	raw, err := sql.Open("sqlite", e.db)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.ExecContext(ctx, `UPDATE job_runs SET status = 'abandoned' WHERE job = 'killed'`); err != nil {
		t.Fatal(err)
	}
	raw.Close()

	header, row := jobsTableRow(t, e, "payments-hourly")
	col := strings.Index(header, "RESULT")
	if col < 0 || len(row) < col {
		t.Fatalf("no RESULT column:\n%s\n%s", header, row)
	}
	res := row[col:]
	const want = "failed: reconcile: payments: platform unavailable: dial tcp"
	if !strings.HasPrefix(res, want) {
		t.Errorf("RESULT of the failed run is %q, want it to start %q", res, want)
	}
	if n := len([]rune(res)); n > 64 || !strings.HasSuffix(res, "…") {
		t.Errorf("RESULT %q: %d characters, want at most 64, cut with …", res, n)
	}
	if strings.ContainsAny(res, "\t\n") {
		t.Errorf("RESULT %q spans more than one cell", res)
	}
	for name, want := range map[string]string{
		"crm-nightly": "interrupted: context canceled",
		"prune":       "ok",
		"short":       "failed: sync: chats: HTTP 401",
		"killed":      "abandoned: no heartbeat since 12:00 (killed)",
	} {
		header, row := jobsTableRow(t, e, name)
		if col := strings.Index(header, "RESULT"); len(row) < col || row[col:] != want {
			t.Errorf("%s: RESULT column of\n%s\n%s\nwant %q", name, header, row, want)
		}
	}

	if got := e.jobsJSON("payments-hourly").LastRun; got == nil || got.Error != long || got.Status != "failed" {
		t.Errorf("jobs --json: last run %+v, want status failed and the whole error", got)
	}
}

// For a job on an interval that never ran, `backstop jobs` printed the
// CLI's own time plus the interval as its next run (a time that moved
// with every call), while serve runs it an interval after serve starts.
// It now says so, and --json has next_run null; once the job has run to
// its end its next run is a time again, from that run.
func TestJobsNextRunOfANeverRunIntervalJob(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.appendConfig(`jobs:
  - {name: often, kind: sync, resources: [contacts], every: 1m}
  - {name: cut-short, kind: sync, resources: [chats], every: 1h30m}
  - {name: ran, kind: sync, resources: [payments], every: 1h}
  - {name: nightly, kind: maintenance, cron: "30 4 * * *"}
`)
	ctx := context.Background()
	started := time.Now().Add(-10 * time.Minute).Truncate(time.Second)
	db := e.openStore()
	for _, run := range []store.JobRun{
		// An interrupted run does not count: serve still starts the job
		// an interval after its own start.
		{Job: "cut-short", Kind: "sync", StartedAt: started, FinishedAt: started, Status: "interrupted", Error: "context canceled"},
		{Job: "ran", Kind: "sync", StartedAt: started, FinishedAt: started, Status: "ok"},
	} {
		if _, err := db.SaveJobRun(ctx, run); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()

	code, stdout, stderr := e.run(ctx, "jobs", "--json")
	if code != exitOK {
		t.Fatalf("jobs --json: exit %d\n%s", code, stderr)
	}
	var rows []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
		t.Fatalf("jobs --json: %v\n%s", err, stdout)
	}
	next := map[string]string{}
	for _, r := range rows {
		var name string
		json.Unmarshal(r["name"], &name)
		raw, ok := r["next_run"]
		if !ok {
			t.Errorf("%s: no next_run in --json", name)
		}
		next[name] = string(raw)
	}
	for _, name := range []string{"often", "cut-short"} {
		if next[name] != "null" {
			t.Errorf("%s: next_run %s, want null (serve runs it an interval after it starts)", name, next[name])
		}
	}
	var ranNext time.Time
	if err := json.Unmarshal([]byte(next["ran"]), &ranNext); err != nil || !ranNext.Equal(started.Add(time.Hour)) {
		t.Errorf("ran: next_run %s, want an hour after its last run, %v", next["ran"], started.Add(time.Hour))
	}
	if next["nightly"] == "null" || next["nightly"] == "" {
		t.Errorf("nightly: next_run %s, want a time", next["nightly"])
	}

	for name, want := range map[string]string{
		"often":     "1m after serve starts",
		"cut-short": "1h30m after serve starts",
		"ran":       started.Add(time.Hour).Local().Format(jobTimeLayout),
	} {
		header, row := jobsTableRow(t, e, name)
		col := strings.Index(header, "NEXT RUN")
		if col < 0 || len(row) < col || !strings.HasPrefix(row[col:], want+" ") {
			t.Errorf("%s: NEXT RUN column of\n%s\n%s\nwant %q", name, header, row, want)
		}
	}
}

// For a job on an interval whose run is going on, `backstop jobs` gave
// now as its next run on every call (it took the job for overdue, from
// the last run that ended). It now gives serve's next tick after now, the
// interval counted from the running run's start.
func TestJobsNextRunOfARunningIntervalJob(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.appendConfig(`jobs:
  - {name: busy, kind: reconcile, every: 20s}
`)
	ctx := context.Background()
	now := time.Now()
	db := e.openStore()
	if _, err := db.SaveJobRun(ctx, store.JobRun{Job: "busy", Kind: "reconcile", StartedAt: now.Add(-2 * time.Minute), FinishedAt: now.Add(-2 * time.Minute), Status: "ok"}); err != nil {
		t.Fatal(err)
	}
	running := now.Add(-30 * time.Second).Truncate(time.Second)
	if _, err := db.StartJobRun(ctx, store.JobRun{Job: "busy", Kind: "reconcile", StartedAt: running}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	code, stdout, stderr := e.run(ctx, "jobs", "--json")
	if code != exitOK {
		t.Fatalf("jobs --json: exit %d\n%s", code, stderr)
	}
	var rows []struct {
		Name    string     `json:"name"`
		NextRun *time.Time `json:"next_run"`
	}
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil || len(rows) != 1 {
		t.Fatalf("jobs --json: %v\n%s", err, stdout)
	}
	// 30 s into the run: the tick at 20 s has passed, the next is at 40 s.
	if want := running.Add(40 * time.Second); rows[0].NextRun == nil || !rows[0].NextRun.Equal(want) {
		t.Errorf("busy: next_run %v, want %v (the next tick after now, from the running run's start)", rows[0].NextRun, want)
	}
}

// jobs --json gives next_run in UTC, as every other time of the JSON
// output: it came in the machine's zone ("+05:30"), as gocron computes it.
func TestJobsJSONTimesAreUTC(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.appendConfig(`jobs:
  - {name: nightly, kind: maintenance, cron: "30 4 * * *"}
`)
	e.openStore().Close() // jobs reads a store that exists
	cmd := exec.Command(binPath, "--config", e.config, "jobs", "--json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.Env = append(e.environ(e.sim.APIKey()), "TZ=Asia/Kolkata")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("jobs --json: %v\n%s%s", err, out, stderr.String())
	}
	var rows []struct {
		Name    string `json:"name"`
		NextRun string `json:"next_run"`
	}
	if err := json.Unmarshal(out, &rows); err != nil || len(rows) != 1 {
		t.Fatalf("jobs --json: %v\n%s", err, out)
	}
	next, err := time.Parse(time.RFC3339, rows[0].NextRun)
	if err != nil || !strings.HasSuffix(rows[0].NextRun, "Z") {
		t.Fatalf("next_run %q: want an RFC 3339 time in UTC (%v)", rows[0].NextRun, err)
	}
	// 04:30 in Kolkata is 23:00 UTC: the schedule is still the zone's.
	if next.Hour() != 23 || next.Minute() != 0 {
		t.Errorf("next_run %s, want 23:00 UTC (04:30 in Asia/Kolkata)", next)
	}
}
