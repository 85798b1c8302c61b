package main

import (
	"context"
	"encoding/json"
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
