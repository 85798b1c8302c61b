package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// A backfill checkpoint the platform can no longer read names the command
// that reads the backfill again and keeps the sync cursor (backfill
// --restart, with the flag the user gave), not `cursors reset`, which
// would also throw the sync cursor away; and that command works. A sync
// job run with `backstop run` names `cursors reset` as `backstop sync` does.
func TestInvalidCursorHintFitsTheCommand(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 11, Objects: 60}})
	e.withJobs()
	ctx := context.Background()
	if code, _, stderr := e.run(ctx, "backfill", "contacts"); code != exitOK {
		t.Fatalf("first backfill: exit %d\n%s", code, stderr)
	}
	db := e.openStore()
	syncBefore, _, err := db.Cursor(ctx, backstop.Contacts, backstop.CursorSync)
	if err == nil {
		// An unfinished checkpoint at a cursor the platform cannot read, as
		// a backfill killed long ago leaves it after the platform rotated
		// its cursors.
		err = db.ResetCursor(ctx, backstop.Contacts, backstop.CursorBackfill)
	}
	if err == nil {
		_, err = db.AdvanceCursor(ctx, backstop.Cursor{Resource: backstop.Contacts, Kind: backstop.CursorBackfill,
			Value: "not-a-cursor", Position: e.sim.Objects(backstop.Contacts)[10].Position()})
	}
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	code, _, stderr := e.run(ctx, "backfill", "contacts", "--emit")
	if code != exitFailure {
		t.Fatalf("backfill at an unreadable checkpoint: exit %d, want 1\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "run `backstop --config "+e.config+" backfill contacts --restart --emit` to start its feed over") ||
		strings.Contains(stderr, "cursors reset") {
		t.Fatalf("error does not name backfill --restart --emit (and only it):\n%s", stderr)
	}
	if code, _, stderr := e.run(ctx, "backfill", "contacts", "--restart", "--emit"); code != exitOK {
		t.Fatalf("the hinted command: exit %d\n%s", code, stderr)
	}
	db = e.openStore()
	syncAfter, _, err := db.Cursor(ctx, backstop.Contacts, backstop.CursorSync)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if syncAfter.Position.Compare(syncBefore.Position) < 0 || syncAfter.Value == "" {
		t.Errorf("sync cursor went from %v to %v", syncBefore.Position, syncAfter.Position)
	}
	e.assertMirrorEqualsSim(backstop.Contacts)

	e.sim.InvalidateCursors()
	code, _, stderr = e.run(ctx, "run", "crm-nightly")
	if code != exitFailure {
		t.Fatalf("run crm-nightly at an unreadable cursor: exit %d, want 1\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "run `backstop --config "+e.config+" cursors reset contacts` to start its feed over") {
		t.Errorf("run crm-nightly does not say how to start over:\n%s", stderr)
	}
}

// A job on an interval is scheduled from its last run, not from serve's
// start: restarted more often than the interval (a deploy, a reboot), serve
// would otherwise never run it. One whose last run is more than an interval
// ago runs as soon as serve starts; `backstop jobs` says when each runs.
func TestIntervalJobRunsAfterRestartWhenDue(t *testing.T) {
	addr := freeAddr(t)
	e := newServeEnv(t, addr, envOpts{sim: sim.Options{Seed: 12, Objects: 20}})
	e.appendConfig(`jobs:
  - {name: overdue, kind: sync, resources: [payments], every: 1h}
  - {name: recent, kind: maintenance, every: 1h}
`)
	ctx := context.Background()
	now := time.Now()
	db := e.openStore()
	for _, run := range []store.JobRun{
		{Job: "overdue", Kind: "sync", StartedAt: now.Add(-2 * time.Hour), FinishedAt: now.Add(-2 * time.Hour), Status: "ok"},
		// A run cut short by the last shutdown does not count as run.
		{Job: "overdue", Kind: "sync", StartedAt: now.Add(-30 * time.Minute), FinishedAt: now.Add(-29 * time.Minute), Status: "interrupted"},
		{Job: "recent", Kind: "maintenance", StartedAt: now.Add(-10 * time.Minute), FinishedAt: now.Add(-10 * time.Minute), Status: "ok"},
	} {
		if _, err := db.SaveJobRun(ctx, run); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()

	code, stdout, stderr := e.run(ctx, "jobs", "--json")
	if code != exitOK {
		t.Fatalf("jobs: exit %d\n%s", code, stderr)
	}
	var rows []struct {
		Name    string    `json:"name"`
		NextRun time.Time `json:"next_run"`
	}
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
		t.Fatalf("jobs --json: %v\n%s", err, stdout)
	}
	for _, r := range rows {
		switch r.Name {
		case "overdue":
			if r.NextRun.After(time.Now().Add(time.Minute)) {
				t.Errorf("overdue: next run %v, want now", r.NextRun)
			}
		case "recent":
			if want := now.Add(50 * time.Minute); r.NextRun.Sub(want).Abs() > time.Second {
				t.Errorf("recent: next run %v, want an hour after its last run, %v", r.NextRun, want)
			}
		}
	}

	cmd, lines := e.startBinaryWith(append(e.environ(e.sim.APIKey()), "BOTIX_WEBHOOK_SECRET="+webhookSecret), "serve")
	timeout := time.After(30 * time.Second)
	for started := false; !started; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("serve ended before running the overdue job")
			}
			if strings.Contains(l, "job started") && strings.Contains(l, "job=recent") {
				t.Errorf("serve ran the job that ran 10 minutes ago at once: %s", l)
			}
			started = strings.Contains(l, "job started") && strings.Contains(l, "job=overdue")
		case <-timeout:
			t.Fatal("serve did not run the job due an hour ago within 30s of its start")
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("serve after SIGTERM: %v", err)
	}
}

// A backfill killed after its last page but before it handed its position
// to the sync cursor hands it over when run again, although it reads
// nothing: the next sync continues from the end of the backfill instead of
// reading the whole feed again.
func TestFinishedBackfillHandsOffWhenRunAgain(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 13, Objects: 100}, pageSize: 20})
	ctx := context.Background()
	if code, _, stderr := e.run(ctx, "backfill", "payments"); code != exitOK {
		t.Fatalf("backfill: exit %d\n%s", code, stderr)
	}
	// The state such a kill leaves: the checkpoint is done, the sync
	// cursor was never saved.
	db := e.openStore()
	err := db.ResetCursor(ctx, backstop.Payments, backstop.CursorSync)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := e.run(ctx, "backfill", "payments", "--json")
	if code != exitOK {
		t.Fatalf("backfill again: exit %d\n%s", code, stderr)
	}
	if s := parseSummary(t, stdout); s.Resources[0].Result != "already_done" || s.Resources[0].Requests != 0 {
		t.Fatalf("backfill again read the feed: %+v", s.Resources[0])
	}
	code, stdout, stderr = e.run(ctx, "sync", "payments", "--json")
	if code != exitOK {
		t.Fatalf("sync: exit %d\n%s", code, stderr)
	}
	if s := parseSummary(t, stdout); s.Resources[0].Pages != 1 || s.Resources[0].Objects != 0 {
		t.Errorf("sync after the finished backfill read %d pages, %d objects; want 1 empty page",
			s.Resources[0].Pages, s.Resources[0].Objects)
	}
	e.assertMirrorEqualsSim(backstop.Payments)
}

// `backstop run JOB` prints the stored run's id in its table too, not only
// with --json, so a cron log can be matched with backstop jobs, the
// dashboard and job_runs.
func TestRunJobPrintsStoredRunID(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 14, Objects: 10}})
	e.withJobs()
	ctx := context.Background()
	e.openStore().Close() // a maintenance job refuses a store.path with no database
	for range 2 {
		code, stdout, stderr := e.run(ctx, "run", "prune")
		if code != exitOK {
			t.Fatalf("run prune: exit %d\n%s", code, stderr)
		}
		db := e.openStore()
		runs, err := db.JobRuns(ctx, "prune", 1)
		db.Close()
		if err != nil || len(runs) != 1 {
			t.Fatalf("stored runs %+v, %v", runs, err)
		}
		if want := fmt.Sprintf("run       %d\n", runs[0].ID); !strings.Contains(stdout, want) {
			t.Errorf("run prune does not print the stored run's id %d:\n%s", runs[0].ID, stdout)
		}
	}
}

// message.updated, which sync and reconcile emit for a message newer than
// the mirror, counts as one of the messages' event types: a plain backfill
// of messages, already syncing, for a target subscribed to "*.updated" is
// refused, instead of writing the newer versions silently so that the
// target never gets them.
func TestPlainBackfillRefusedForMessageUpdatedSubscriber(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 15, Objects: 40}})
	e.appendConfig(`targets:
  - {name: updates, url: "http://127.0.0.1:9/hook", allow_private: true, events: ["*.updated"]}
`)
	ctx := context.Background()
	if code, _, stderr := e.run(ctx, "backfill", "messages"); code != exitOK {
		t.Fatalf("first backfill: exit %d\n%s", code, stderr)
	}
	id := e.sim.Objects(backstop.Messages)[3].ID
	if _, ok := e.sim.Update(backstop.Messages, id); !ok {
		t.Fatalf("update %s", id)
	}
	code, _, stderr := e.run(ctx, "backfill", "messages", "--restart")
	if code != exitUsage || !strings.Contains(stderr, "target updates subscribes to its events (message.updated)") {
		t.Fatalf("plain backfill --restart of messages: exit %d, want 2 naming the subscriber\n%s", code, stderr)
	}
	code, stdout, stderr := e.run(ctx, "sync", "messages", "--json")
	if code != exitOK {
		t.Fatalf("sync: exit %d\n%s", code, stderr)
	}
	if s := parseSummary(t, stdout); s.Resources[0].Emitted == nil || *s.Resources[0].Emitted != 1 {
		t.Errorf("sync did not emit the updated message: %+v", s.Resources[0])
	}
}

// TestMisspeltTZIsRefusedBySchedulers: with TZ=Europe/Berlni, Go keeps
// local time as UTC without a word, and a "0 3 * * *" job ran at 3:00 UTC,
// hours off. serve and jobs, which schedule by it, exit 2 naming the job's
// cron and TZ; a command that schedules nothing (cursors) still runs.
func TestMisspeltTZIsRefusedBySchedulers(t *testing.T) {
	e := newServeEnv(t, freeAddr(t), envOpts{sim: sim.Options{Seed: 1, Objects: 5}})
	e.appendConfig("jobs:\n  - {name: nightly, kind: sync, cron: \"0 3 * * *\"}\n")
	vars := []string{"BOTIX_API_KEY=" + e.sim.APIKey(), "BOTIX_WEBHOOK_SECRET=" + webhookSecret, "TZ=Europe/Berlni"}
	for _, command := range []string{"serve", "jobs"} {
		code, _, stderr := runBinaryFor(t, 30*time.Second, e.dir, vars, command)
		if code != exitUsage || !strings.Contains(stderr, `jobs[0].cron is local time, but TZ="Europe/Berlni" names no time zone`) {
			t.Errorf("%s with TZ=Europe/Berlni: exit %d, want 2 naming the cron and TZ\n%s", command, code, stderr)
		}
	}
	if code, _, stderr := runBinaryFor(t, 30*time.Second, e.dir, vars, "cursors"); code != exitOK {
		t.Errorf("cursors with TZ=Europe/Berlni: exit %d, want 0\n%s", code, stderr)
	}
	vars[2] = "TZ=Europe/Berlin"
	if code, _, stderr := runBinaryFor(t, 30*time.Second, e.dir, vars, "jobs"); code != exitOK {
		t.Errorf("jobs with TZ=Europe/Berlin: exit %d, want 0\n%s", code, stderr)
	}
}
