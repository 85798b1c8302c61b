package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
)

// A reconcile run left running by a process that died is closed as
// abandoned once its heartbeat is ReconcileStaleAfter old: by the next
// reconcile of its resource, or by maintenance for every resource. A run
// whose heartbeat is younger may be going on in another process and is
// left alone.
func TestStaleReconcileRunsAreAbandoned(t *testing.T) {
	ctx := context.Background()
	db, clk := openTest(t)
	status := func(id int64) ReconcileRun {
		t.Helper()
		runs, err := db.ReconcileRuns(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range runs {
			if r.ID == id {
				return r
			}
		}
		t.Fatalf("no run %d", id)
		return ReconcileRun{}
	}
	start := func(r backstop.Resource) int64 {
		t.Helper()
		id, err := db.StartReconcile(ctx, backstop.ReconcileReport{Resource: r, Full: true})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}

	// Two runs are killed mid-way: contacts after beating at +30m,
	// payments right after its start.
	killed := start(backstop.Contacts)
	if err := db.MarkSeen(ctx, killed, []string{"ct_1", "ct_2"}); err != nil {
		t.Fatal(err)
	}
	clk.Set(t0.Add(30 * time.Minute))
	if err := db.ReconcileHeartbeat(ctx, killed); err != nil {
		t.Fatal(err)
	}
	payments := start(backstop.Payments)

	// At +1h20m the contacts run beat 50m ago: it may be alive elsewhere.
	clk.Set(t0.Add(80 * time.Minute))
	next := start(backstop.Contacts)
	if st := status(killed).Status; st != "running" {
		t.Fatalf("a run that beat 50 minutes ago is %s, want still running", st)
	}
	if err := db.FinishReconcile(ctx, next, backstop.ReconcileReport{Resource: backstop.Contacts}); err != nil {
		t.Fatal(err)
	}

	// At +1h31m its heartbeat is 61m old: the next contacts run closes it,
	// and only it (payments is another resource's).
	clk.Set(t0.Add(91 * time.Minute))
	start(backstop.Contacts)
	got := status(killed)
	if got.Status != "abandoned" || !got.FinishedAt.Equal(clk.Now()) || !strings.Contains(got.Error, "abandoned") {
		t.Fatalf("killed run after the next start: %+v, want abandoned now with a reason", got)
	}
	var marks int
	if err := db.r.GetContext(ctx, &marks, `SELECT count(*) FROM reconcile_seen WHERE run_id = ?`, killed); err != nil || marks != 0 {
		t.Errorf("%d seen marks of the abandoned run kept (%v)", marks, err)
	}
	if st := status(payments).Status; st != "running" {
		t.Fatalf("a contacts run closed the payments run: %s", st)
	}

	// Maintenance closes every resource's stale runs.
	clk.Set(t0.Add(3 * time.Hour))
	n, err := db.AbandonStaleReconciles(ctx)
	if err != nil || n != 2 { // payments', and the contacts run started at +1h31m
		t.Fatalf("AbandonStaleReconciles = %d, %v; want 2", n, err)
	}
	if st := status(payments).Status; st != "abandoned" {
		t.Errorf("payments run after maintenance: %s, want abandoned", st)
	}
	if n, err := db.AbandonStaleReconciles(ctx); err != nil || n != 0 {
		t.Errorf("second AbandonStaleReconciles = %d, %v; want none", n, err)
	}
	// A live run keeps beating; a closed one is left alone.
	live := start(backstop.Chats)
	clk.Set(t0.Add(5 * time.Hour))
	if err := db.ReconcileHeartbeat(ctx, live); err != nil {
		t.Fatal(err)
	}
	if n, err := db.AbandonStaleReconciles(ctx); err != nil || n != 0 {
		t.Errorf("a run that just beat was abandoned: %d, %v", n, err)
	}
	// A run closed as abandoned while it went on (a page took over the
	// stale time) learns so at its next heartbeat, and stops: its seen
	// marks are gone.
	if err := db.ReconcileHeartbeat(ctx, killed); err == nil || !strings.Contains(err.Error(), "closed as abandoned") || status(killed).Status != "abandoned" {
		t.Errorf("heartbeat of an abandoned run: %v, status %s; want an error saying it was closed", err, status(killed).Status)
	}
	if err := db.ReconcileHeartbeat(ctx, 9999); !errors.Is(err, backstop.ErrNotFound) {
		t.Errorf("heartbeat of no run: %v, want ErrNotFound", err)
	}
}
