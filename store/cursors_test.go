package store

import (
	"context"
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
