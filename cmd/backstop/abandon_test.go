package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/backstop-sync/backstop/sources/sim"
)

// A reconcile killed with SIGKILL leaves its run "running". Maintenance
// (and the next reconcile of the resource) closes it as abandoned at once,
// naming the process, since that ran on this host and is gone. A run of
// another host is known alive only from its heartbeat, beaten every page:
// it is left running until that heartbeat is older than any live run's
// could be.
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
	// Its process ran here and is gone: maintenance closes it at once.
	if code, _, stderr := e.run(context.Background(), "run", "prune"); code != exitOK {
		t.Fatalf("run prune: exit %d\n%s", code, stderr)
	}
	var errText string
	if err := raw.QueryRow(`SELECT status, coalesce(error, '') FROM reconcile_runs ORDER BY id LIMIT 1`).Scan(&status, &errText); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("its process (pid %d on host ", cmd.Process.Pid); status != "abandoned" || !strings.Contains(errText, want) {
		t.Fatalf("the killed run after maintenance: %s %q, want abandoned, saying %q", status, errText, want)
	}

	// The same run as another host's: right away it might be going on
	// there, and maintenance leaves it.
	if _, err := raw.Exec(`UPDATE reconcile_runs SET status = 'running', finished_at = NULL, error = NULL,
		owner = 'elsewhere' || substr(owner, instr(owner, '/'))`); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := e.run(context.Background(), "run", "prune"); code != exitOK {
		t.Fatalf("run prune: exit %d\n%s", code, stderr)
	}
	if status, _, _ := row(); status != "running" {
		t.Fatalf("another host's run that beat moments ago was closed as %s", status)
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
