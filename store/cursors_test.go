package store

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
)

// Page commits (ApplyPage and EmitPage) never move a saved cursor back: a
// run that is behind another (two overlapping syncs of one resource) still
// writes its objects and events, but leaves the cursor where the run ahead
// put it. An equal position is saved (Done, the time saved). Deleting the
// cursor (ResetCursor, ResetCursors) is how a run starts over.
func TestPageCommitsNeverMoveCursorBack(t *testing.T) {
	ctx := context.Background()
	r := backstop.Contacts
	pos := func(at, id string) backstop.Position {
		return backstop.Position{UpdatedAt: mustTime(t, at), ID: id}
	}
	early, late := pos("2026-01-12T16:24:47Z", "ct_10"), pos("2026-11-30T19:50:12Z", "ct_90")
	routes := []backstop.Route{{Target: "crm", Events: []string{"contact.*"}}}

	for _, kind := range []backstop.CursorKind{backstop.CursorSync, backstop.CursorBackfill} {
		t.Run(string(kind), func(t *testing.T) {
			db, clk := openTest(t)
			saved := func() backstop.Cursor {
				t.Helper()
				c, ok, err := db.Cursor(ctx, r, kind)
				if err != nil || !ok {
					t.Fatalf("Cursor = %v, %v", ok, err)
				}
				return c
			}
			// Run B, ahead, commits its last page.
			if _, err := db.ApplyPage(ctx, nil, cursorAt(r, kind, "b-end", late)); err != nil {
				t.Fatal(err)
			}
			// Run A, behind, commits a page: the object is written, the
			// cursor stays at B's position.
			o := obj(t, r, "ct_10", "2026-01-12T16:24:47Z", nil)
			clk.Set(t0.Add(time.Minute))
			res, err := db.ApplyPage(ctx, []backstop.Object{o}, cursorAt(r, kind, "a-early", early))
			if err != nil || res.New != 1 {
				t.Fatalf("ApplyPage behind = %+v, %v; want the object written", res, err)
			}
			if c := saved(); c.Value != "b-end" || c.Position != late || !c.UpdatedAt.Equal(t0) {
				t.Fatalf("ApplyPage moved the cursor back: %+v, want b-end at %v", c, late)
			}
			// The same through the emit path.
			ev := backstop.Event{
				ID: backstop.EventID(backstop.DedupKey(r, "ct_11", early.UpdatedAt)), Type: "contact.created",
				Resource: r, ObjectID: "ct_11", UpdatedAt: early.UpdatedAt, Origin: backstop.OriginSync,
				Data: obj(t, r, "ct_11", "2026-01-12T16:24:47Z", nil).Data,
			}
			out, err := db.EmitPage(ctx, []backstop.Event{ev}, routes, cursorAt(r, kind, "a-early", early))
			if err != nil || out[0].Status != backstop.EmitAccepted {
				t.Fatalf("EmitPage behind = %+v, %v; want the event accepted", out, err)
			}
			if c := saved(); c.Value != "b-end" || c.Position != late {
				t.Fatalf("EmitPage moved the cursor back: %+v, want b-end at %v", c, late)
			}
			// An equal position is saved, with Done and the time.
			done := cursorAt(r, kind, "a-end", late)
			done.Done = true
			clk.Set(t0.Add(2 * time.Minute))
			if _, err := db.EmitPage(ctx, nil, routes, done); err != nil {
				t.Fatal(err)
			}
			if c := saved(); c.Value != "a-end" || !c.Done || !c.UpdatedAt.Equal(t0.Add(2*time.Minute)) {
				t.Fatalf("cursor at an equal position: %+v, want a-end, done, saved at +2m", c)
			}
			// Starting over: ResetCursor deletes this kind only, and the
			// next page commit saves wherever it is.
			other := backstop.CursorSync
			if kind == backstop.CursorSync {
				other = backstop.CursorBackfill
			}
			if _, err := db.ApplyPage(ctx, nil, cursorAt(r, other, "other", late)); err != nil {
				t.Fatal(err)
			}
			if err := db.ResetCursor(ctx, r, kind); err != nil {
				t.Fatal(err)
			}
			if _, ok, err := db.Cursor(ctx, r, other); err != nil || !ok {
				t.Fatalf("ResetCursor(%s) deleted the %s cursor too: %v, %v", kind, other, ok, err)
			}
			if _, err := db.ApplyPage(ctx, nil, cursorAt(r, kind, "restart", early)); err != nil {
				t.Fatal(err)
			}
			if c := saved(); c.Value != "restart" || c.Position != early {
				t.Fatalf("after ResetCursor: %+v, want restart at %v", c, early)
			}
			// ResetCursors (backstop cursors reset) likewise.
			if _, err := db.ApplyPage(ctx, nil, cursorAt(r, kind, "ahead", late)); err != nil {
				t.Fatal(err)
			}
			if err := db.ResetCursors(ctx, r); err != nil {
				t.Fatal(err)
			}
			if _, err := db.EmitPage(ctx, nil, routes, cursorAt(r, kind, "from-start", backstop.Position{})); err != nil {
				t.Fatal(err)
			}
			if c := saved(); c.Value != "from-start" || c.Position != (backstop.Position{}) {
				t.Fatalf("after ResetCursors: %+v, want from-start at the zero position", c)
			}
		})
	}
	db, _ := openTest(t)
	if err := db.ResetCursor(ctx, "widgets", backstop.CursorSync); err == nil {
		t.Error("ResetCursor of an unknown resource succeeded")
	}
	if err := db.ResetCursor(ctx, r, "sideways"); err == nil {
		t.Error("ResetCursor of an unknown kind succeeded")
	}
}

// An emitting backfill is told apart from a silent one even when the last
// object it read came by webhook first (its event is the webhook's): any
// backfill event of the resource says it emitted.
func TestCheckpointEmittedWhenItsLastObjectCameByWebhook(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	r := backstop.Contacts
	routes := []backstop.Route{{Target: "crm", Events: []string{"contact.*"}}}
	event := func(id string, at time.Time, origin backstop.Origin) backstop.Event {
		return backstop.Event{ID: backstop.EventID(backstop.DedupKey(r, id, at)), Type: "contact.created",
			Resource: r, ObjectID: id, UpdatedAt: at, Origin: origin, Data: obj(t, r, id, at.Format(time.RFC3339), nil).Data}
	}
	at1, at2 := mustTime(t, "2026-01-01T00:00:00Z"), mustTime(t, "2026-01-02T00:00:00Z")
	last := backstop.Position{UpdatedAt: at2, ID: "ct_2"}
	chk := cursorAt(r, backstop.CursorBackfill, "page-1", last)
	if emitted, err := db.CheckpointEmitted(ctx, chk); err != nil || emitted {
		t.Fatalf("no events: CheckpointEmitted = %v, %v; want false", emitted, err)
	}
	// The webhook brings ct_2's version first; the backfill then emits
	// ct_1 (new) and finds ct_2 a duplicate.
	if _, err := db.Emit(ctx, []backstop.Event{event("ct_2", at2, backstop.OriginWebhook)}, routes); err != nil {
		t.Fatal(err)
	}
	if _, err := db.EmitPage(ctx, []backstop.Event{event("ct_1", at1, backstop.OriginBackfill), event("ct_2", at2, backstop.OriginBackfill)}, routes, chk); err != nil {
		t.Fatal(err)
	}
	if emitted, err := db.CheckpointEmitted(ctx, chk); err != nil || !emitted {
		t.Errorf("an emitting backfill whose last object came by webhook: CheckpointEmitted = %v, %v; want true", emitted, err)
	}
}

// A sync (or backfill --emit) page compares its objects with the mirror
// before its transaction; a webhook that committed a newer version of one
// of them in between used to be followed by the page's older version,
// queued after it (billing got payment.refunded, then payment.succeeded
// from origin sync). The page's commit now leaves that event out as
// EmitSuperseded, queues the others, and saves its cursor.
func TestEmitPageLeavesOutEventsAWebhookSuperseded(t *testing.T) {
	db, _ := openTest(t)
	ctx := context.Background()
	r := backstop.Payments
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	// The sync read pay_1 (succeeded at 11:00) and pay_2; then the refund
	// of pay_1 came by webhook.
	if _, err := db.Emit(ctx, []backstop.Event{
		event(t, "evt_refund", "payment.refunded", backstop.OriginWebhook, r, "pay_1", "2024-05-01T12:00:00Z"),
	}, routes); err != nil {
		t.Fatal(err)
	}
	page := []backstop.Event{
		event(t, "evt_sync_1", "payment.succeeded", backstop.OriginSync, r, "pay_1", "2024-05-01T11:00:00Z"),
		event(t, "evt_sync_2", "payment.succeeded", backstop.OriginSync, r, "pay_2", "2024-05-01T11:30:00Z"),
	}
	cur := cursorAt(r, backstop.CursorSync, "c1", backstop.Position{UpdatedAt: mustTime(t, "2024-05-01T11:30:00Z"), ID: "pay_2"})
	res, err := db.EmitPage(ctx, page, routes, cur)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Status != backstop.EmitSuperseded || res[0].Outbox != 0 || res[1].Status != backstop.EmitAccepted || res[1].Outbox != 1 {
		t.Fatalf("EmitPage results %+v, want pay_1's older version superseded and pay_2's queued", res)
	}
	rows, err := db.OutboxRows(ctx, "billing")
	if err != nil {
		t.Fatal(err)
	}
	var queued []string
	for _, row := range rows {
		queued = append(queued, row.EventID)
	}
	if strings.Join(queued, ",") != "evt_refund,evt_sync_2" {
		t.Errorf("billing queue %v, want the refund and pay_2 only", queued)
	}
	if got, ok, err := db.Get(ctx, r, "pay_1"); err != nil || !ok || !got.UpdatedAt.Equal(mustTime(t, "2024-05-01T12:00:00Z")) {
		t.Errorf("pay_1 in the mirror at %v (ok=%v err=%v), want the webhook's refund", got.UpdatedAt, ok, err)
	}
	if c, ok, err := db.Cursor(ctx, r, backstop.CursorSync); err != nil || !ok || c.Value != "c1" {
		t.Errorf("cursor %+v (ok=%v err=%v), want the page's saved", c, ok, err)
	}
}

// A backfill checkpoint keeps the start of the backfill that began it
// (StartedAt): every page commit, whatever start its cursor carries (a
// resumed run's own, or none), leaves the stored one as it is, so a resumed
// backfill without events cannot move forward the time before which it
// writes silently; one that carries an earlier start (a backfill that
// began before the one that committed first) lowers it. ResetCursor
// deletes it with the checkpoint, and the next commit saves its own.
func TestPageCommitsKeepTheBackfillStart(t *testing.T) {
	ctx := context.Background()
	db, clk := openTest(t)
	r := backstop.Payments
	kind := backstop.CursorBackfill
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	first := t0.Add(-time.Hour)
	started := func() time.Time {
		t.Helper()
		c, ok, err := db.Cursor(ctx, r, kind)
		if err != nil || !ok {
			t.Fatalf("Cursor = %v, %v", ok, err)
		}
		return c.StartedAt
	}
	n := 0
	// page returns a checkpoint after the previous one's, carrying start.
	page := func(start time.Time) backstop.Cursor {
		n++
		c := cursorAt(r, kind, fmt.Sprintf("p%d", n), backstop.Position{UpdatedAt: t0.Add(time.Duration(n) * time.Second), ID: fmt.Sprintf("pay_%02d", n)})
		c.StartedAt = start
		return c
	}
	_, _, gen, err := db.CursorGeneration(ctx, r, kind)
	if err != nil {
		t.Fatal(err)
	}

	if _, err := db.ApplyPage(ctx, nil, page(first)); err != nil {
		t.Fatal(err)
	}
	if got := started(); !got.Equal(first) {
		t.Fatalf("StartedAt after the first page = %v, want %v", got, first)
	}
	for _, later := range []time.Time{{}, t0.Add(time.Hour)} {
		clk.Set(clk.Now().Add(time.Minute))
		commits := []struct {
			name   string
			commit func(backstop.Cursor) error
		}{
			{"ApplyPage", func(c backstop.Cursor) error { _, err := db.ApplyPage(ctx, nil, c); return err }},
			{"ApplyPageAt", func(c backstop.Cursor) error { _, _, err := db.ApplyPageAt(ctx, gen, nil, c); return err }},
			{"EmitPage", func(c backstop.Cursor) error { _, err := db.EmitPage(ctx, nil, routes, c); return err }},
			{"EmitPageAt", func(c backstop.Cursor) error { _, _, err := db.EmitPageAt(ctx, gen, nil, routes, c); return err }},
			{"ApplyEmitPageAt", func(c backstop.Cursor) error {
				_, _, _, err := db.ApplyEmitPageAt(ctx, gen, nil, nil, routes, c)
				return err
			}},
			{"AdvanceCursor", func(c backstop.Cursor) error { _, err := db.AdvanceCursor(ctx, c); return err }},
		}
		for _, cm := range commits {
			c := page(later)
			if err := cm.commit(c); err != nil {
				t.Fatalf("%s: %v", cm.name, err)
			}
			if got, _, _ := db.Cursor(ctx, r, kind); got.Value != c.Value {
				t.Fatalf("%s did not save its page: cursor %+v", cm.name, got)
			}
			if got := started(); !got.Equal(first) {
				t.Errorf("%s with StartedAt %v changed the stored start to %v, want %v kept", cm.name, later, got, first)
			}
		}
	}

	// Two first fills that overlap (a hand-run backfill beside serve's
	// job): whichever commits first, the earlier start is kept.
	earlier := first.Add(-time.Minute)
	if _, err := db.ApplyPage(ctx, nil, page(earlier)); err != nil {
		t.Fatal(err)
	}
	if got := started(); !got.Equal(earlier) {
		t.Errorf("StartedAt after a page of a backfill that started earlier = %v, want %v", got, earlier)
	}

	if err := db.ResetCursor(ctx, r, kind); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := db.Cursor(ctx, r, kind); err != nil || ok {
		t.Fatalf("Cursor after ResetCursor: ok=%v, %v; want none", ok, err)
	}
	// The reset counted a generation: commits read it again, as a
	// restarted backfill does.
	if _, _, gen, err = db.CursorGeneration(ctx, r, kind); err != nil {
		t.Fatal(err)
	}
	// Back at the start of the feed, as backfill --restart is.
	n = 0
	restart := t0.Add(2 * time.Hour)
	if _, _, _, err := db.ApplyEmitPageAt(ctx, gen, nil, nil, routes, page(restart)); err != nil {
		t.Fatal(err)
	}
	if got := started(); !got.Equal(restart) {
		t.Errorf("StartedAt after ResetCursor and a new page = %v, want the new backfill's %v", got, restart)
	}

	// A sync cursor saved without a start has none.
	sc := cursorAt(r, backstop.CursorSync, "s1", backstop.Position{UpdatedAt: t0, ID: "pay_01"})
	if _, err := db.ApplyPage(ctx, nil, sc); err != nil {
		t.Fatal(err)
	}
	if c, _, err := db.Cursor(ctx, r, backstop.CursorSync); err != nil || !c.StartedAt.IsZero() {
		t.Errorf("sync cursor StartedAt = %v, %v; want zero", c.StartedAt, err)
	}
}

// A checkpoint saved before migration 0018 reads with no start (zero
// StartedAt), and the first page commit that carries one saves it.
func TestMigration18CheckpointWithoutStart(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db := openUpgraded(t, path, 17,
		`INSERT INTO cursors (resource, kind, value, pos_updated_at, pos_id, done, updated_at) VALUES
			('payments', 'backfill', 'cur_p_9', '2026-01-02T00:00:00.000000000Z', 'pay_9', 0, '2026-01-05T00:00:00.000000000Z')`)
	defer db.Close()
	c, ok, err := db.Cursor(ctx, backstop.Payments, backstop.CursorBackfill)
	if err != nil || !ok || !c.StartedAt.IsZero() || c.Value != "cur_p_9" {
		t.Fatalf("old checkpoint = %+v, %v, %v; want cur_p_9 with no start", c, ok, err)
	}
	resumed := mustTime(t, "2026-01-06T00:00:00Z")
	next := cursorAt(backstop.Payments, backstop.CursorBackfill, "cur_p_10",
		backstop.Position{UpdatedAt: mustTime(t, "2026-01-02T00:00:01Z"), ID: "pay_10"})
	next.StartedAt = resumed
	if _, err := db.ApplyPage(ctx, nil, next); err != nil {
		t.Fatal(err)
	}
	if c, _, err := db.Cursor(ctx, backstop.Payments, backstop.CursorBackfill); err != nil || !c.StartedAt.Equal(resumed) {
		t.Errorf("StartedAt after a page = %v, %v; want %v", c.StartedAt, err, resumed)
	}
}
