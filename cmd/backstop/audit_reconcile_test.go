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
	bsync "github.com/backstop-sync/backstop/sync"
)

// A reconcile killed with SIGKILL after re-emitting some pages is shown
// with what it did: its row, running and then closed as abandoned, holds
// the pages, objects and re-emitted events of its last beat, not zeros,
// while those events were queued for the targets.
func TestKilledReconcileRunShowsWhatItDid(t *testing.T) {
	const pageSize = 10
	e := newEnv(t, envOpts{
		sim:       sim.Options{Seed: 16, Objects: 1500, Limit: 60, Window: time.Second},
		perMinute: 3600, window: "1s", pageSize: pageSize,
	})
	cmd, lines := e.startBinary("--log-level", "debug", "reconcile", "--full", "payments")
	waitLines(t, lines, "page reconciled", 3, time.Minute)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	raw, err := sql.Open("sqlite", e.db+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	var emitted int
	if err := raw.QueryRow(`SELECT count(*) FROM processed_events WHERE origin = 'reconcile'`).Scan(&emitted); err != nil {
		t.Fatal(err)
	}
	type run struct {
		status                                   string
		pages, scanned, missing, reemitted, reqs int
	}
	first := func() run {
		t.Helper()
		var r run
		if err := raw.QueryRow(`SELECT status, pages, scanned, missing, reemitted, requests FROM reconcile_runs ORDER BY id LIMIT 1`).
			Scan(&r.status, &r.pages, &r.scanned, &r.missing, &r.reemitted, &r.reqs); err != nil {
			t.Fatal(err)
		}
		return r
	}
	// The mirror was empty: every object read was missing and re-emitted.
	// The kill may have come between a page's events and its beat, so
	// the row can lag one page behind what was queued.
	check := func(what string, r run) {
		t.Helper()
		if r.pages < 3 || r.scanned < 3*pageSize || r.missing != r.scanned || r.reemitted != r.scanned ||
			r.reqs < r.pages || emitted < r.reemitted || emitted-r.reemitted > pageSize {
			t.Errorf("%s run %+v, want the counts of its last page (at least 3 pages, %d events re-emitted in all)", what, r, emitted)
		}
	}
	got := first()
	if got.status != "running" {
		t.Fatalf("killed run is %s, want running", got.status)
	}
	check("killed", got)

	// Two hours later (its heartbeat moved back), the next reconcile of
	// payments closes it as abandoned, with the same counts.
	old := time.Now().Add(-2 * time.Hour).UTC().Format("2006-01-02T15:04:05.000000000Z")
	if _, err := raw.Exec(`UPDATE reconcile_runs SET heartbeat_at = ?, started_at = ? WHERE status = 'running'`, old, old); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := e.run(context.Background(), "reconcile", "payments", "--since", "1m"); code != exitOK {
		t.Fatalf("reconcile: exit %d\n%s", code, stderr)
	}
	after := first()
	if after.status != "abandoned" {
		t.Fatalf("killed run after the next reconcile: %s, want abandoned", after.status)
	}
	check("abandoned", after)
}

// reconcileSince runs reconcile payments with args and returns the start of
// its window as printed in --json.
func reconcileSince(t *testing.T, e *env, args ...string) time.Time {
	t.Helper()
	code, stdout, stderr := e.run(context.Background(), append([]string{"reconcile", "payments", "--json"}, args...)...)
	if code != exitOK {
		t.Fatalf("reconcile %v: exit %d\n%s", args, code, stderr)
	}
	var rows []struct {
		Since  time.Time `json:"since"`
		Result string    `json:"result"`
	}
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil || len(rows) != 1 || rows[0].Result != "ok" {
		t.Fatalf("reconcile %v: %v\n%s", args, err, stdout)
	}
	return rows[0].Since
}

// A reconcile by hand with --since in the future (a typo in the year)
// compares nothing; on a fresh store it does not stand for a first run:
// the next default run still looks back 24 hours, not 10 minutes from the
// typo's start, which would leave the day before unread.
func TestReconcileFutureSinceIsNoFirstRun(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 8, Objects: 50}})
	if got := reconcileSince(t, e, "--since", "2099-01-01"); !got.Equal(time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("since %v, want 2099-01-01", got)
	}
	before := time.Now()
	got := reconcileSince(t, e)
	// The JSON gives whole seconds.
	if want := before.Add(-bsync.FirstReconcileWindow); got.Before(want.Add(-2*time.Second)) || got.After(time.Now().Add(-bsync.FirstReconcileWindow)) {
		t.Errorf("default run after the future one: since %s, want 24h back (%s)", got.Format(time.RFC3339), want.UTC().Format(time.RFC3339))
	}
}
