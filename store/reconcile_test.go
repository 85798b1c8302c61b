package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
)

func TestVersions(t *testing.T) {
	db, _ := openTest(t)
	ctx := context.Background()
	a := obj(t, backstop.Payments, "pay_a", "2024-05-01T10:00:00Z", nil)
	b := obj(t, backstop.Payments, "pay_b", "2024-05-01T10:00:00.5+02:00", nil)
	c := obj(t, backstop.Contacts, "pay_c", "2024-05-01T11:00:00Z", nil) // another table
	if err := db.InsertBatch(ctx, []backstop.Object{a, b, c}); err != nil {
		t.Fatal(err)
	}
	got, err := db.Versions(ctx, backstop.Payments, []string{"pay_a", "pay_b", "pay_c", "pay_none"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got["pay_a"].Equal(a.UpdatedAt) || !got["pay_b"].Equal(b.UpdatedAt) {
		t.Errorf("versions %v, want pay_a and pay_b only, at their updated_at", got)
	}
	if got, err := db.Versions(ctx, backstop.Payments, nil); err != nil || len(got) != 0 {
		t.Errorf("versions of no ids: %v, %v", got, err)
	}
	// More ids than one IN list holds.
	ids := make([]string, 1200)
	for i := range ids {
		ids[i] = fmt.Sprintf("pay_%04d", i)
	}
	ids[1100] = "pay_a"
	if got, err := db.Versions(ctx, backstop.Payments, ids); err != nil || len(got) != 1 {
		t.Errorf("versions of 1200 ids: %v, %v, want pay_a", got, err)
	}
	if _, err := db.Versions(ctx, "invoices", []string{"x"}); err == nil {
		t.Error("versions of an unknown resource: no error")
	}
}

func countSeen(t *testing.T, db *DB) int {
	t.Helper()
	var n int
	if err := db.r.Get(&n, `SELECT count(*) FROM reconcile_seen`); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestReconcileRunsAndOrphans(t *testing.T) {
	db, clk := openTest(t)
	ctx := context.Background()
	r := backstop.Payments
	var objs []backstop.Object
	for i := range 5 {
		objs = append(objs, obj(t, r, fmt.Sprintf("pay_%d", i), "2024-05-01T10:00:00Z", nil))
	}
	if err := db.InsertBatch(ctx, objs); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := db.LastReconcile(ctx, r); err != nil || ok {
		t.Fatalf("last reconcile before any: ok=%v err=%v", ok, err)
	}

	// A full run sees 3 of the 5 (and one the mirror lacks, twice).
	start := clk.Now()
	id, err := db.StartReconcile(ctx, backstop.ReconcileReport{Resource: r, StartedAt: start, Full: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.MarkSeen(ctx, id, []string{"pay_0", "pay_1", "pay_new"}); err != nil {
		t.Fatal(err)
	}
	if err := db.MarkSeen(ctx, id, []string{"pay_new", "pay_4"}); err != nil {
		t.Fatal(err)
	}
	n, err := db.CountOrphans(ctx, id, r)
	if err != nil || n != 2 {
		t.Fatalf("orphans %d (err %v), want pay_2 and pay_3", n, err)
	}
	if s := countSeen(t, db); s != 0 {
		t.Errorf("%d seen marks left after counting", s)
	}
	clk.Set(start.Add(3 * time.Second))
	rep := backstop.ReconcileReport{Resource: r, StartedAt: start, Full: true, Pages: 2, Scanned: 4, Missing: 1,
		Reemitted: 1, Orphans: 2, Cost: backstop.Cost{Requests: 2, RateLimited: 1}, Duration: 3 * time.Second}
	if err := db.FinishReconcile(ctx, id, rep); err != nil {
		t.Fatal(err)
	}

	// A dry run and a failed run later do not count as the last reconcile.
	clk.Set(start.Add(time.Hour))
	dry, err := db.StartReconcile(ctx, backstop.ReconcileReport{Resource: r, DryRun: true, Since: start})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.FinishReconcile(ctx, dry, backstop.ReconcileReport{Resource: r, DryRun: true}); err != nil {
		t.Fatal(err)
	}
	failed, err := db.StartReconcile(ctx, backstop.ReconcileReport{Resource: r, Full: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.MarkSeen(ctx, failed, []string{"pay_0"}); err != nil {
		t.Fatal(err)
	}
	if err := db.FinishReconcile(ctx, failed, backstop.ReconcileReport{Resource: r, Err: errors.New("page 3: boom")}); err != nil {
		t.Fatal(err)
	}
	if s := countSeen(t, db); s != 0 {
		t.Errorf("%d seen marks left after a failed run", s)
	}
	last, ok, err := db.LastReconcile(ctx, r)
	if err != nil || !ok || !last.Equal(start) {
		t.Errorf("last reconcile %v ok=%v err=%v, want %v", last, ok, err, start)
	}
	if _, ok, err := db.LastReconcile(ctx, backstop.Chats); err != nil {
		t.Fatal(err)
	} else if ok {
		t.Error("chats have a last reconcile")
	}

	runs, err := db.ReconcileRuns(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 3 {
		t.Fatalf("%d runs, want 3", len(runs))
	}
	if runs[0].ID != failed || runs[0].Status != "failed" || runs[0].Error != "page 3: boom" {
		t.Errorf("newest run %+v, want the failed one with its error", runs[0])
	}
	if runs[1].ID != dry || !runs[1].DryRun || !runs[1].Since.Equal(start) || runs[1].Status != "ok" {
		t.Errorf("second run %+v, want the dry run", runs[1])
	}
	first := runs[2]
	want := rep
	want.Since = time.Time{}
	if first.ID != id || first.Status != "ok" || first.FinishedAt != start.Add(3*time.Second) ||
		first.ReconcileReport != want {
		t.Errorf("first run %+v, want %+v", first, want)
	}
	if runs, err := db.ReconcileRuns(ctx, 1); err != nil || len(runs) != 1 || runs[0].ID != failed {
		t.Errorf("limit 1: %+v %v", runs, err)
	}

	// Pruning keeps the run the default window starts from, however old.
	pruned, err := db.PruneReconcileRuns(ctx, start.Add(2*time.Hour))
	if err != nil || pruned != 2 {
		t.Fatalf("PruneReconcileRuns = %d, %v; want 2 (the dry and the failed run)", pruned, err)
	}
	if last, ok, err := db.LastReconcile(ctx, r); err != nil || !ok || !last.Equal(start) {
		t.Errorf("after pruning, last reconcile %v ok=%v err=%v, want %v", last, ok, err, start)
	}
	if runs, err := db.ReconcileRuns(ctx, 0); err != nil || len(runs) != 1 || runs[0].ID != id {
		t.Errorf("after pruning: %+v %v, want only run %d", runs, err, id)
	}

	if err := db.FinishReconcile(ctx, 999, rep); !errors.Is(err, backstop.ErrNotFound) {
		t.Errorf("finish an unknown run: %v, want ErrNotFound", err)
	}
	if _, err := db.StartReconcile(ctx, backstop.ReconcileReport{Resource: "invoices"}); err == nil {
		t.Error("start a run of an unknown resource: no error")
	}
}

// A run whose window began after the previous run's start left time that
// no run compared: the default window keeps starting from the run before
// the gap until a run reaches back over it, and pruning keeps that run.
func TestLastReconcileSkipsRunsThatLeftAGap(t *testing.T) {
	db, clk := openTest(t)
	ctx := context.Background()
	r := backstop.Payments
	run := func(since time.Time, full bool) time.Time {
		t.Helper()
		start := clk.Now().Add(time.Hour)
		clk.Set(start)
		id, err := db.StartReconcile(ctx, backstop.ReconcileReport{Resource: r, StartedAt: start, Since: since, Full: full})
		if err != nil {
			t.Fatal(err)
		}
		if err := db.FinishReconcile(ctx, id, backstop.ReconcileReport{Resource: r, Full: full}); err != nil {
			t.Fatal(err)
		}
		return start
	}
	last := func() time.Time {
		t.Helper()
		got, ok, err := db.LastReconcile(ctx, r)
		if err != nil || !ok {
			t.Fatalf("last reconcile: ok=%v err=%v", ok, err)
		}
		return got
	}
	first := run(clk.Now().Add(-24*time.Hour), false)
	chained := run(first.Add(-10*time.Minute), false)
	if got := last(); !got.Equal(chained) {
		t.Fatalf("after a chained run: %v, want %v", got, chained)
	}
	// Two narrow runs, each reaching back over the other but not to chained.
	narrow := run(clk.Now().Add(30*time.Minute), false)
	run(narrow.Add(-time.Minute), false)
	if got := last(); !got.Equal(chained) {
		t.Errorf("after narrow runs: %v, want %v (the time after it was never compared)", got, chained)
	}
	// A future window compares nothing either.
	run(clk.Now().Add(48*time.Hour), false)
	if got := last(); !got.Equal(chained) {
		t.Errorf("after a run with a future window: %v, want %v", got, chained)
	}
	// Pruning everything old keeps the run the gap starts at.
	if _, err := db.PruneReconcileRuns(ctx, clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := last(); !got.Equal(chained) {
		t.Errorf("after pruning: %v, want %v", got, chained)
	}
	closing := run(chained.Add(-10*time.Minute), false)
	if got := last(); !got.Equal(closing) {
		t.Errorf("after a run over the gap: %v, want %v", got, closing)
	}
	run(clk.Now().Add(30*time.Minute), false)
	full := run(time.Time{}, true)
	if got := last(); !got.Equal(full) {
		t.Errorf("after a full run: %v, want %v", got, full)
	}
}

// A run whose window began after its own start (a --since in the
// future) compared nothing: alone, it does not count as a last reconcile,
// so the next default run is a first run's; after other runs it changes
// nothing.
func TestLastReconcileIgnoresEmptyWindows(t *testing.T) {
	db, clk := openTest(t)
	ctx := context.Background()
	r := backstop.Payments
	run := func(since time.Time) time.Time {
		t.Helper()
		start := clk.Now().Add(time.Hour)
		clk.Set(start)
		id, err := db.StartReconcile(ctx, backstop.ReconcileReport{Resource: r, StartedAt: start, Since: since})
		if err != nil {
			t.Fatal(err)
		}
		if err := db.FinishReconcile(ctx, id, backstop.ReconcileReport{Resource: r}); err != nil {
			t.Fatal(err)
		}
		return start
	}
	run(clk.Now().Add(24 * time.Hour))
	if got, ok, err := db.LastReconcile(ctx, r); err != nil || ok {
		t.Fatalf("after only a run with a future window: %v ok=%v err=%v, want none", got, ok, err)
	}
	first := run(clk.Now().Add(-24 * time.Hour))
	run(clk.Now().Add(24 * time.Hour))
	if got, ok, err := db.LastReconcile(ctx, r); err != nil || !ok || !got.Equal(first) {
		t.Errorf("after a run and a future one: %v ok=%v err=%v, want %v", got, ok, err, first)
	}
}

// EmitChanged leaves out, in its own transaction, the events of objects
// the mirror holds in a newer version, and is Emit for the others: a
// missing or older object is emitted, the same version is the dedup's
// duplicate, and an unknown type passes through.
func TestEmitChanged(t *testing.T) {
	db, _ := openTest(t)
	ctx := context.Background()
	r, rec := backstop.Payments, backstop.OriginReconcile
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	// Webhooks brought pay_newer's refund and pay_same's success.
	if _, err := db.Emit(ctx, []backstop.Event{
		event(t, "evt_w1", "payment.refunded", backstop.OriginWebhook, r, "pay_newer", "2024-05-01T12:00:00Z"),
		event(t, "evt_w2", "payment.succeeded", backstop.OriginWebhook, r, "pay_same", "2024-05-01T10:00:00Z"),
	}, routes); err != nil {
		t.Fatal(err)
	}
	if err := db.InsertBatch(ctx, []backstop.Object{obj(t, r, "pay_older", "2024-05-01T09:00:00Z", map[string]any{"status": "pending"})}); err != nil {
		t.Fatal(err)
	}
	events := []backstop.Event{
		// Read upstream before the refund came.
		event(t, "evt_r1", "payment.succeeded", rec, r, "pay_newer", "2024-05-01T11:00:00Z"),
		event(t, "evt_r2", "payment.succeeded", rec, r, "pay_same", "2024-05-01T10:00:00.000Z"),
		event(t, "evt_r3", "payment.succeeded", rec, r, "pay_older", "2024-05-01T11:00:00Z"),
		event(t, "evt_r4", "payment.failed", rec, r, "pay_missing", "2024-05-01T11:00:00Z"),
		{ID: "evt_r5", Type: "payment.disputed_v2", Origin: rec, Data: []byte(`{}`)},
	}
	res, err := db.EmitChanged(ctx, events, routes)
	if err != nil {
		t.Fatal(err)
	}
	want := []backstop.EmitStatus{backstop.EmitSuperseded, backstop.EmitDuplicate, backstop.EmitAccepted, backstop.EmitAccepted, backstop.EmitAccepted}
	for i, w := range want {
		if res[i].Status != w {
			t.Errorf("event %s: %s, want %s", events[i].ID, res[i].Status, w)
		}
	}
	if res[0].Outbox != 0 || res[2].Outbox != 1 || !res[2].MirrorWritten || res[3].Outbox != 1 || !res[3].MirrorWritten {
		t.Errorf("results %+v: the superseded event queued, or an older or missing object's was not", res)
	}
	if _, ok, err := db.ProcessedEvent(ctx, "evt_r1"); err != nil || ok {
		t.Errorf("superseded event stored: ok=%v err=%v", ok, err)
	}
	if got, ok, err := db.Get(ctx, r, "pay_newer"); err != nil || !ok || !got.UpdatedAt.Equal(mustTime(t, "2024-05-01T12:00:00Z")) {
		t.Errorf("pay_newer in the mirror at %v (ok=%v err=%v), want the webhook's", got.UpdatedAt, ok, err)
	}
	rows, err := db.OutboxRows(ctx, "billing")
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range rows {
		if row.EventID == "evt_r1" {
			t.Error("superseded event queued")
		}
	}
	if len(rows) != 5 { // two webhooks, pay_older, pay_missing, the unknown type
		t.Errorf("billing outbox %d rows, want 5", len(rows))
	}
	if res, err := db.EmitChanged(ctx, nil, routes); err != nil || len(res) != 0 {
		t.Errorf("no events: %v, %v", res, err)
	}
	bad := []backstop.Event{event(t, "evt_r6", "payment.failed", rec, r, "pay_other", "2024-05-01T11:00:00Z"), {ID: "evt_bad", Origin: rec}}
	if _, err := db.EmitChanged(ctx, bad, routes); err == nil || !strings.Contains(err.Error(), "event 2 of 2 (evt_bad)") {
		t.Errorf("an event without type: %v, want an error naming it", err)
	}
	if _, ok, err := db.ProcessedEvent(ctx, "evt_r6"); err != nil {
		t.Fatal(err)
	} else if ok {
		t.Error("the batch with a bad event was committed in part")
	}
}

// A reconcile run whose process ran on this host and is gone (a serve
// killed and restarted) is closed as abandoned by the next reconcile of
// its resource at once, saying which process that was, not an hour after
// its last heartbeat; one of this process, or of a process of another
// host, is left running.
func TestReconcileRunOfAGoneProcessIsClosedAtOnce(t *testing.T) {
	me, pid := goneProcess(t)
	dead := runOwner{host: me.host, pid: pid, start: "12345", space: me.space}
	for _, c := range []struct {
		name  string
		owner string
		gone  bool
	}{
		{"exited child", dead.String(), true},
		{"this process", me.String(), false},
		{"another host", runOwner{host: me.host + "-other", pid: dead.pid, start: dead.start, space: me.space}.String(), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			db, clk := openTest(t)
			ctx := context.Background()
			first, err := db.StartReconcile(ctx, backstop.ReconcileReport{Resource: backstop.Chats})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := db.w.ExecContext(ctx, `UPDATE reconcile_runs SET owner = ? WHERE id = ?`, c.owner, first); err != nil {
				t.Fatal(err)
			}
			clk.Set(t0.Add(30 * time.Second)) // its heartbeat is fresh
			if _, err := db.StartReconcile(ctx, backstop.ReconcileReport{Resource: backstop.Chats}); err != nil {
				t.Fatal(err)
			}
			runs, err := db.ReconcileRuns(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			var got *ReconcileRun
			for i := range runs {
				if runs[i].ID == first {
					got = &runs[i]
				}
			}
			if got == nil {
				t.Fatalf("run %d not listed: %+v", first, runs)
			}
			want := fmt.Sprintf("abandoned: its process (pid %d on host %s) is gone", dead.pid, me.host)
			switch {
			case c.gone && (got.Status != "abandoned" || !strings.Contains(got.Error, want)):
				t.Errorf("the run of a process gone: %s %q, want abandoned at once, saying %q", got.Status, got.Error, want)
			case !c.gone && got.Status != "running":
				t.Errorf("the run is %s (%q), want still running", got.Status, got.Error)
			}
		})
	}
}
