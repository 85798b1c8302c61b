package main

import (
	"context"
	"database/sql"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/backstop-sync/backstop/sources/sim"
)

// A reconcile killed with SIGKILL leaves its run "running"; the store
// knows it is alive from its heartbeat, beaten every page. Once that
// heartbeat is older than any live run's could be, maintenance (and the
// next reconcile of the resource) closes the run as abandoned.
func TestKilledReconcileIsClosedAsAbandoned(t *testing.T) {
	e := newEnv(t, envOpts{
		sim:       sim.Options{Seed: 16, Objects: 1500, Limit: 60, Window: time.Second},
		perMinute: 3600, window: "1s", pageSize: 10,
	})
	e.withJobs()
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
	row := func() (status, started, beat string) {
		t.Helper()
		if err := raw.QueryRow(`SELECT status, started_at, heartbeat_at FROM reconcile_runs ORDER BY id LIMIT 1`).
			Scan(&status, &started, &beat); err != nil {
			t.Fatal(err)
		}
		return
	}
	status, started, beat := row()
	if status != "running" || beat <= started {
		t.Fatalf("killed run: status %s, started %s, heartbeat %s; want running with a heartbeat after its start", status, started, beat)
	}
	// Right away it might be a run going on in another process: the next
	// run of the resource and maintenance leave it.
	if code, _, stderr := e.run(context.Background(), "run", "prune"); code != exitOK {
		t.Fatalf("run prune: exit %d\n%s", code, stderr)
	}
	if status, _, _ := row(); status != "running" {
		t.Fatalf("a run that beat moments ago was closed as %s", status)
	}
	// Two hours later (its heartbeat moved back), maintenance closes it.
	old := time.Now().Add(-2 * time.Hour).UTC().Format("2006-01-02T15:04:05.000000000Z")
	if _, err := raw.Exec(`UPDATE reconcile_runs SET heartbeat_at = ?, started_at = ? WHERE status = 'running'`, old, old); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := e.run(context.Background(), "run", "prune"); code != exitOK {
		t.Fatalf("run prune: exit %d\n%s", code, stderr)
	}
	if status, _, _ := row(); status != "abandoned" {
		t.Errorf("killed run two hours later, after maintenance: %s, want abandoned", status)
	}
}
