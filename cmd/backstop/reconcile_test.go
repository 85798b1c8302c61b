package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources/sim"
)

type reconcileRow struct {
	Resource                       string
	Scanned, Missing, Behind       int
	Reemitted, Suppressed, Orphans int
	Requests                       int
	Result                         string
}

func runReconcile(t *testing.T, e *env, args ...string) reconcileRow {
	t.Helper()
	code, stdout, stderr := e.run(context.Background(), append([]string{"reconcile", "payments", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("reconcile %v: exit %d\n%s", args, code, stderr)
	}
	var rows []reconcileRow
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil || len(rows) != 1 {
		t.Fatalf("reconcile output: %v\n%s", err, stdout)
	}
	return rows[0]
}

// Changes the mirror missed are found and re-emitted once; a dry run emits
// nothing; a second run finds nothing.
func TestReconcileCommand(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 8, Objects: 400}, pageSize: 50})
	if code, _, stderr := e.run(context.Background(), "backfill", "payments"); code != 0 {
		t.Fatalf("backfill: %d\n%s", code, stderr)
	}
	changed := map[string]bool{}
	for _, o := range e.sim.Mutate(120) {
		if o.Resource == backstop.Payments {
			changed[o.ID] = true
		}
	}
	if len(changed) == 0 {
		t.Fatal("no payment changed")
	}
	dry := runReconcile(t, e, "--dry-run", "--since", "1h")
	if dry.Missing+dry.Behind != len(changed) || dry.Reemitted != 0 {
		t.Fatalf("dry run: %+v, want %d found and nothing emitted", dry, len(changed))
	}
	got := runReconcile(t, e, "--since", "1h")
	if got.Missing+got.Behind != len(changed) || got.Reemitted != len(changed) || got.Result != "ok" {
		t.Fatalf("reconcile: %+v, want %d found and re-emitted", got, len(changed))
	}
	e.assertMirrorEqualsSim(backstop.Payments)
	again := runReconcile(t, e, "--since", time.Now().Add(-time.Hour).UTC().Format(time.RFC3339))
	if again.Reemitted != 0 || again.Missing+again.Behind != 0 {
		t.Errorf("second reconcile: %+v, want nothing to do", again)
	}
	full := runReconcile(t, e, "--full")
	if full.Scanned != len(e.sim.Objects(backstop.Payments)) || full.Orphans != 0 {
		t.Errorf("full reconcile: %+v", full)
	}
	if code, _, _ := e.run(context.Background(), "reconcile", "--since", "soon"); code != 2 {
		t.Errorf("bad --since: exit %d, want 2", code)
	}
}

// Objects gone from the mirror whose versions the store has processed
// (rows deleted by hand after a reconcile emitted them) are written back by
// the next full reconcile, though not queued to the targets again: every
// reconcile found them missing, counted them suppressed, and the mirror
// stayed without them for good.
func TestReconcileRepairsAMirrorThatLostProcessedVersions(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 8, Objects: 200}, pageSize: 50})
	if code, _, stderr := e.run(context.Background(), "backfill", "payments"); code != 0 {
		t.Fatalf("backfill: %d\n%s", code, stderr)
	}
	e.sim.Mutate(60)
	if got := runReconcile(t, e, "--full"); got.Reemitted == 0 {
		t.Fatalf("reconcile after mutations: %+v, want versions re-emitted", got)
	}
	raw, err := sql.Open("sqlite", e.db+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	// Three objects whose newest version is a processed event's.
	res, err := raw.Exec(`DELETE FROM payments WHERE id IN (SELECT p.id FROM payments p
		JOIN processed_events e ON e.resource = 'payments' AND e.object_id = p.id AND e.updated_at = p.updated_at LIMIT 3)`)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 3 {
		t.Fatalf("deleted %d mirrored payments whose version was processed, want 3", n)
	}
	raw.Close()
	got := runReconcile(t, e, "--full")
	if got.Missing != 3 || got.Reemitted != 0 || got.Suppressed != 3 {
		t.Errorf("reconcile with 3 processed versions gone from the mirror: %+v, want 3 missing, none re-emitted, 3 suppressed", got)
	}
	e.assertMirrorEqualsSim(backstop.Payments)
	if again := runReconcile(t, e, "--full"); again.Missing != 0 {
		t.Errorf("the next reconcile: %+v, want nothing missing", again)
	}
}

// A full reconcile job counts the orphans, as backstop reconcile --full
// does, and backstop run and jobs --json show them: the count was stored
// in the run's reports only, and every other count of the run was shown.
func TestFullReconcileJobShowsItsOrphans(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 8, Objects: 30}, pageSize: 50})
	e.appendConfig(`jobs:
  - {name: pay-full, kind: reconcile, resources: [payments], full: true, cron: "0 3 * * *"}
  - {name: pay-hourly, kind: reconcile, resources: [payments], cron: "0 * * * *"}
`)
	if code, _, stderr := e.run(context.Background(), "backfill", "payments"); code != 0 {
		t.Fatalf("backfill: %d\n%s", code, stderr)
	}
	raw, err := sql.Open("sqlite", e.db+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec(`INSERT INTO payments (id, updated_at, data, synced_at) VALUES ('pay_orphan', '2026-01-01T00:00:00.000000000Z', '{"id":"pay_orphan","updated_at":"2026-01-01T00:00:00Z"}', '2026-01-01T00:00:00.000000000Z')`); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	code, stdout, stderr := e.run(context.Background(), "run", "pay-full")
	if code != exitOK || !regexp.MustCompile(`(?m)^orphans\s+1$`).MatchString(stdout) {
		t.Errorf("run pay-full: exit %d, want a line orphans 1\n%s%s", code, stdout, stderr)
	}
	if last := e.jobsJSON("pay-full").LastRun; last == nil || last.Counts.Orphans == nil || *last.Counts.Orphans != 1 {
		t.Errorf("jobs --json: pay-full's last run %+v, want orphans 1", last)
	}
	// A reconcile that is not full counts none: no orphans at all, not 0.
	if code, stdout, _ := e.run(context.Background(), "run", "pay-hourly"); code != exitOK || strings.Contains(stdout, "orphans") {
		t.Errorf("run pay-hourly: exit %d, want no orphans line\n%s", code, stdout)
	}
	if last := e.jobsJSON("pay-hourly").LastRun; last == nil || last.Counts.Orphans != nil {
		t.Errorf("jobs --json: pay-hourly's last run %+v, want no orphans", last)
	}
}
