package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
)

// routes used by the emit tests: billing takes payments, crm contacts and
// chats, audit everything; broken has a malformed glob and matches nothing.
var testRoutes = []backstop.Route{
	{Target: "billing", Events: []string{"payment.*"}},
	{Target: "crm", Events: []string{"contact.*", "chat.*"}},
	{Target: "audit", Events: []string{"*"}},
	{Target: "broken", Events: []string{"["}},
}

// openFull opens a store with synchronous=FULL, as the intake does.
func openFull(t testing.TB) (*DB, *clock) {
	t.Helper()
	clk := &clock{t: t0}
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "events.db"),
		Options{Synchronous: "FULL", Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return db, clk
}

// event builds an event of type typ about the object r/id at updatedAt (as
// written, not canonicalised), whose data is the object's JSON.
func event(t testing.TB, id, typ string, origin backstop.Origin, r backstop.Resource, objID, updatedAt string) backstop.Event {
	t.Helper()
	o := obj(t, r, objID, updatedAt, map[string]any{"status": strings.TrimPrefix(typ, string(r[:len(r)-1])+".")})
	return backstop.Event{
		ID: id, Type: typ, Resource: r, ObjectID: objID, UpdatedAt: o.UpdatedAt,
		CreatedAt: mustTime(t, "2024-05-01T10:00:01Z"), Origin: origin, Data: o.Data,
	}
}

// payment builds a payment.succeeded webhook event.
func payment(t testing.TB, id, payID, updatedAt string) backstop.Event {
	return event(t, id, "payment.succeeded", backstop.OriginWebhook, backstop.Payments, payID, updatedAt)
}

func emit(t *testing.T, db *DB, routes []backstop.Route, evs ...backstop.Event) []backstop.EmitResult {
	t.Helper()
	res, err := db.Emit(context.Background(), evs, routes)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(evs) {
		t.Fatalf("Emit returned %d results for %d events", len(res), len(evs))
	}
	return res
}

func accepted(mirror bool, outbox int) backstop.EmitResult {
	return backstop.EmitResult{Status: backstop.EmitAccepted, MirrorWritten: mirror, Outbox: outbox}
}

var duplicate = backstop.EmitResult{Status: backstop.EmitDuplicate}

func mustProcessed(t *testing.T, db *DB, id string) ProcessedEvent {
	t.Helper()
	pe, ok, err := db.ProcessedEvent(context.Background(), id)
	if err != nil || !ok {
		t.Fatalf("ProcessedEvent(%s) = %v, %v; want the stored event", id, ok, err)
	}
	return pe
}

func countProcessed(t *testing.T, db *DB) int {
	t.Helper()
	n, err := db.CountProcessed(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func outboxRows(t *testing.T, db *DB, target string) []OutboxRow {
	t.Helper()
	rows, err := db.OutboxRows(context.Background(), target)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func mirrored(t *testing.T, db *DB, r backstop.Resource, id string) backstop.Object {
	t.Helper()
	o, ok, err := db.Get(context.Background(), r, id)
	if err != nil || !ok {
		t.Fatalf("Get(%s, %s) = %v, %v; want the mirrored object", r, id, ok, err)
	}
	return o
}

func TestEmitAcceptedThenDuplicateByEventID(t *testing.T) {
	db, _ := openTest(t)
	ev := payment(t, "evt_1", "pay_1", "2024-05-01T10:00:00Z")

	if got := emit(t, db, testRoutes, ev); got[0] != accepted(true, 2) {
		t.Fatalf("first Emit = %+v, want accepted, mirrored, 2 outbox rows", got[0])
	}
	// A platform retry of the same delivery: same event_id, same body.
	if got := emit(t, db, testRoutes, ev); got[0] != duplicate {
		t.Fatalf("second Emit = %+v, want duplicate", got[0])
	}
	// Same event_id with another version: still the same event.
	again := payment(t, "evt_1", "pay_1", "2024-05-01T11:00:00Z")
	if got := emit(t, db, testRoutes, again); got[0] != duplicate {
		t.Fatalf("Emit of a known event_id with another body = %+v, want duplicate", got[0])
	}

	if n := countProcessed(t, db); n != 1 {
		t.Errorf("CountProcessed = %d, want 1", n)
	}
	if rows := outboxRows(t, db, ""); len(rows) != 2 {
		t.Errorf("%d outbox rows, want 2", len(rows))
	}
	if o := mirrored(t, db, backstop.Payments, "pay_1"); !bytes.Equal(o.Data, ev.Data) {
		t.Errorf("mirror holds %s, want the first version %s", o.Data, ev.Data)
	}
	pe := mustProcessed(t, db, "evt_1")
	want := ProcessedEvent{
		EventID: "evt_1", DedupKey: ev.DedupKey(), Type: "payment.succeeded", Resource: backstop.Payments,
		ObjectID: "pay_1", UpdatedAt: ev.UpdatedAt, Origin: backstop.OriginWebhook, CreatedAt: ev.CreatedAt,
		ReceivedAt: t0, Data: ev.Data,
	}
	if fmt.Sprint(pe) != fmt.Sprint(want) {
		t.Errorf("ProcessedEvent =\n%+v\nwant\n%+v", pe, want)
	}
	if err := db.Ping(context.Background()); err != nil {
		t.Errorf("Ping = %v", err)
	}
	if _, ok, err := db.ProcessedEvent(context.Background(), "evt_nope"); ok || err != nil {
		t.Errorf("ProcessedEvent of an unknown id = %v, %v; want not found", ok, err)
	}
}

// A version already processed is a duplicate, queued to no target again;
// but a mirror that lost it (a row deleted by hand, say) is written again
// from it, only when newer as always. Sync and reconcile found such an
// object missing, emitted it, and counted it written, while the mirror
// stayed without it for good.
func TestEmitDuplicateRepairsAMirrorThatLostItsVersion(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	webhook := payment(t, "evt_1", "pay_1", "2024-05-01T10:00:00Z")
	if got := emit(t, db, testRoutes, webhook); got[0] != accepted(true, 2) {
		t.Fatalf("first Emit = %+v, want accepted", got[0])
	}
	reconciled := event(t, "", "payment.succeeded", backstop.OriginReconcile, backstop.Payments, "pay_1", "2024-05-01T10:00:00Z")
	reconciled.ID = backstop.EventID(reconciled.DedupKey())
	repaired := backstop.EmitResult{Status: backstop.EmitDuplicate, MirrorWritten: true}
	for _, ev := range []backstop.Event{reconciled, webhook} {
		if _, err := db.w.ExecContext(ctx, `DELETE FROM payments WHERE id = 'pay_1'`); err != nil {
			t.Fatal(err)
		}
		if got := emit(t, db, testRoutes, ev); got[0] != repaired {
			t.Errorf("Emit of %s (%s) with the object gone from the mirror = %+v, want %+v", ev.ID, ev.Origin, got[0], repaired)
		}
		if o, ok, err := db.Get(ctx, backstop.Payments, "pay_1"); err != nil || !ok || !bytes.Equal(o.Data, webhook.Data) {
			t.Errorf("after %s: mirror holds %s (ok=%v, err=%v), want the version again", ev.ID, o.Data, ok, err)
		}
	}
	// With the mirror whole, a duplicate writes nothing.
	if got := emit(t, db, testRoutes, reconciled); got[0] != duplicate {
		t.Errorf("Emit of a duplicate with the mirror whole = %+v, want %+v", got[0], duplicate)
	}
	if rows := outboxRows(t, db, ""); len(rows) != 2 {
		t.Errorf("%d outbox rows, want the first event's 2 only", len(rows))
	}
	if n := countProcessed(t, db); n != 1 {
		t.Errorf("CountProcessed = %d, want 1", n)
	}
}

func TestEmitDuplicateByDedupKey(t *testing.T) {
	// The same version seen by a webhook and by reconciliation, its
	// updated_at written in two forms, in both orders.
	webhook := payment(t, "evt_wh", "pay_1", "2024-05-01T10:00:00Z")
	reconciled := event(t, "", "payment.succeeded", backstop.OriginReconcile, backstop.Payments, "pay_1", "2024-05-01T10:00:00.000000Z")
	reconciled.ID = backstop.EventID(reconciled.DedupKey())
	if webhook.DedupKey() != reconciled.DedupKey() {
		t.Fatalf("dedup keys differ: %q vs %q", webhook.DedupKey(), reconciled.DedupKey())
	}
	for _, tc := range []struct {
		name          string
		first, second backstop.Event
	}{
		{"webhook first", webhook, reconciled},
		{"reconcile first", reconciled, webhook},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, _ := openTest(t)
			if got := emit(t, db, testRoutes, tc.first); got[0] != accepted(true, 2) {
				t.Fatalf("first = %+v, want accepted", got[0])
			}
			if got := emit(t, db, testRoutes, tc.second); got[0] != duplicate {
				t.Fatalf("second = %+v, want duplicate", got[0])
			}
			if _, ok, err := db.ProcessedEvent(context.Background(), tc.second.ID); err != nil {
				t.Fatal(err)
			} else if ok {
				t.Errorf("the duplicate %s was stored", tc.second.ID)
			}
			if pe := mustProcessed(t, db, tc.first.ID); pe.Origin != tc.first.Origin {
				t.Errorf("stored origin %s, want %s", pe.Origin, tc.first.Origin)
			}
			rows := outboxRows(t, db, "")
			if len(rows) != 2 || rows[0].EventID != tc.first.ID || rows[1].EventID != tc.first.ID {
				t.Errorf("outbox = %+v, want 2 rows of %s", rows, tc.first.ID)
			}
		})
	}
}

func TestEmitDuplicatesInOneBatch(t *testing.T) {
	db, _ := openTest(t)
	a := payment(t, "evt_a", "pay_1", "2024-05-01T10:00:00Z")
	sameKey := payment(t, "evt_a2", "pay_1", "2024-05-01T10:00:00.000Z")
	b := payment(t, "evt_b", "pay_2", "2024-05-01T10:00:00Z")
	got := emit(t, db, testRoutes, a, a, sameKey, b, b)
	want := []backstop.EmitResult{accepted(true, 2), duplicate, duplicate, accepted(true, 2), duplicate}
	if !slices.Equal(got, want) {
		t.Errorf("Emit = %+v\nwant   %+v", got, want)
	}
	if n := countProcessed(t, db); n != 2 {
		t.Errorf("CountProcessed = %d, want 2", n)
	}
	if rows := outboxRows(t, db, "billing"); len(rows) != 2 {
		t.Errorf("billing has %d rows, want 2", len(rows))
	}
}

func TestEmitOlderVersionNeverOverwritesMirror(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	newer := payment(t, "evt_new", "pay_1", "2024-05-01T12:00:00Z")
	older := payment(t, "evt_old", "pay_1", "2024-05-01T11:00:00Z")
	if got := emit(t, db, testRoutes, newer); got[0] != accepted(true, 2) {
		t.Fatalf("newer = %+v", got[0])
	}
	// The stale event is a real, new event: recorded and delivered, but the
	// mirror keeps the newer version.
	if got := emit(t, db, testRoutes, older); got[0] != accepted(false, 2) {
		t.Fatalf("older = %+v, want accepted without mirror write", got[0])
	}
	if o := mirrored(t, db, backstop.Payments, "pay_1"); !bytes.Equal(o.Data, newer.Data) {
		t.Errorf("mirror holds %s, want the newer %s", o.Data, newer.Data)
	}
	mustProcessed(t, db, "evt_old")

	// The rule is the one ApplyPage keeps: a page with an even newer version,
	// then an event in between, then the page's version again.
	newest := obj(t, backstop.Payments, "pay_1", "2024-05-01T13:00:00Z", map[string]any{"status": "refunded"})
	if _, err := db.ApplyPage(ctx, []backstop.Object{newest}, cursorAt(backstop.Payments, backstop.CursorSync, "c", newest.Position())); err != nil {
		t.Fatal(err)
	}
	between := payment(t, "evt_between", "pay_1", "2024-05-01T12:30:00Z")
	if got := emit(t, db, testRoutes, between); got[0] != accepted(false, 2) {
		t.Fatalf("between = %+v, want accepted without mirror write", got[0])
	}
	if o := mirrored(t, db, backstop.Payments, "pay_1"); !bytes.Equal(o.Data, newest.Data) {
		t.Errorf("mirror holds %s, want the page's %s", o.Data, newest.Data)
	}
	res, err := db.ApplyPage(ctx, []backstop.Object{newest}, cursorAt(backstop.Payments, backstop.CursorSync, "c2", newest.Position()))
	if err != nil || res.Unchanged != 1 {
		t.Errorf("ApplyPage of the same version = %+v, %v; want 1 unchanged", res, err)
	}
}

func TestEmitOutboxPerMatchingRouteAndEnvelope(t *testing.T) {
	db, clk := openTest(t)
	clk.Set(t0.Add(time.Hour))
	// Data as the platform sent it, with spacing and HTML characters that a
	// re-encoding would change.
	data := json.RawMessage(`{"id":"ct_1", "created_at":"2024-01-01T00:00:00Z","updated_at":"2024-05-01T10:00:00Z","name":"<Ann & Bob>"}`)
	ev := backstop.Event{
		ID: "evt_c1", Type: "contact.created", Resource: backstop.Contacts, ObjectID: "ct_1",
		UpdatedAt: mustTime(t, "2024-05-01T10:00:00Z"), CreatedAt: mustTime(t, "2024-05-01T10:00:00.5+02:00"),
		Origin: backstop.OriginWebhook, Data: data,
	}
	if got := emit(t, db, testRoutes, ev); got[0] != accepted(true, 2) {
		t.Fatalf("Emit = %+v, want 2 outbox rows (crm, audit)", got[0])
	}
	rows := outboxRows(t, db, "")
	var targets []string
	for _, r := range rows {
		targets = append(targets, r.Target)
	}
	if !slices.Equal(targets, []string{"crm", "audit"}) {
		t.Fatalf("outbox targets = %v, want [crm audit] in route order", targets)
	}
	for _, target := range []string{"billing", "broken"} {
		if rows := outboxRows(t, db, target); len(rows) != 0 {
			t.Errorf("%s got %d rows, want none", target, len(rows))
		}
	}
	crm := outboxRows(t, db, "crm")
	if len(crm) != 1 {
		t.Fatalf("crm has %d rows, want 1", len(crm))
	}
	r := crm[0]
	now := t0.Add(time.Hour)
	if r.EventID != "evt_c1" || r.EventType != "contact.created" || r.Status != "pending" || r.Attempts != 0 ||
		!r.NextAttemptAt.Equal(now) || !r.CreatedAt.Equal(now) || !r.UpdatedAt.Equal(now) || r.LastStatus != 0 || r.LastError != "" {
		t.Errorf("outbox row = %+v", r)
	}
	var env struct {
		EventID   string          `json:"event_id"`
		Event     string          `json:"event"`
		CreatedAt string          `json:"created_at"`
		Origin    string          `json:"origin"`
		Data      json.RawMessage `json:"data"`
	}
	dec := json.NewDecoder(bytes.NewReader(r.Payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		t.Fatalf("payload %s: %v", r.Payload, err)
	}
	if env.EventID != "evt_c1" || env.Event != "contact.created" || env.CreatedAt != "2024-05-01T08:00:00.5Z" || env.Origin != "webhook" {
		t.Errorf("envelope = %+v", env)
	}
	if !bytes.Equal(env.Data, data) {
		t.Errorf("envelope data = %s, want the bytes as received %s", env.Data, data)
	}
}

func TestEmitUnknownTypeStoredWithoutMirror(t *testing.T) {
	db, _ := openTest(t)
	unknown := func(id string) backstop.Event {
		return backstop.Event{ID: id, Type: "invoice.paid", CreatedAt: t0, Origin: backstop.OriginWebhook,
			Data: json.RawMessage(`{"id":"inv_1","total":10}`)}
	}
	got := emit(t, db, testRoutes, unknown("evt_u1"), unknown("evt_u2"), unknown("evt_u1"))
	want := []backstop.EmitResult{accepted(false, 1), accepted(false, 1), duplicate}
	if !slices.Equal(got, want) {
		t.Errorf("Emit = %+v, want %+v (no dedup key: distinct ids are distinct events)", got, want)
	}
	pe := mustProcessed(t, db, "evt_u1")
	if pe.DedupKey != "" || pe.Resource != "" || pe.Type != "invoice.paid" || !pe.UpdatedAt.IsZero() ||
		string(pe.Data) != `{"id":"inv_1","total":10}` {
		t.Errorf("stored %+v", pe)
	}
	for _, r := range backstop.Resources {
		if n, err := db.Count(context.Background(), r); err != nil || n != 0 {
			t.Errorf("Count(%s) = %d, %v; want an empty mirror", r, n, err)
		}
	}
	if rows := outboxRows(t, db, "audit"); len(rows) != 2 {
		t.Errorf("audit has %d rows, want 2", len(rows))
	}

	// A truncated event of an unknown type names nothing to fetch: it is
	// kept as it came, not left waiting for a fetch that cannot happen.
	cut := unknown("evt_u3")
	cut.Truncated, cut.Data = true, json.RawMessage(`{"id":"inv_2"}`)
	if got := emit(t, db, testRoutes, cut); got[0] != accepted(false, 1) {
		t.Errorf("Emit of a truncated unknown event = %+v, want accepted and queued", got[0])
	}
	if n, err := db.CountTruncatedPending(context.Background()); err != nil || n != 0 {
		t.Errorf("CountTruncatedPending = %d, %v; want 0", n, err)
	}
	// Its delivery says that its data is partial, as the platform did (the
	// flag was dropped, and the target took the data for whole).
	for _, r := range outboxRows(t, db, "audit") {
		var env map[string]json.RawMessage
		if err := json.Unmarshal(r.Payload, &env); err != nil {
			t.Fatal(err)
		}
		if got, want := string(env["truncated"]), map[bool]string{true: "true", false: ""}[r.EventID == "evt_u3"]; got != want {
			t.Errorf("%s's envelope: truncated %q, want %q: %s", r.EventID, got, want, r.Payload)
		}
	}
}

func TestTruncatedLifecycle(t *testing.T) {
	ctx := context.Background()
	db, clk := openTest(t)
	truncated := func(id, payID string) backstop.Event {
		return backstop.Event{ID: id, Type: "payment.succeeded", Resource: backstop.Payments, ObjectID: payID,
			CreatedAt: t0, Origin: backstop.OriginWebhook, Data: json.RawMessage(`{"id":"` + payID + `"}`), Truncated: true}
	}
	dueIDs := func(now time.Time) []string {
		t.Helper()
		evs, err := db.DueTruncated(ctx, now, 10)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, ev := range evs {
			if !ev.Truncated || ev.Resource != backstop.Payments || ev.Type != "payment.succeeded" || ev.Origin != backstop.OriginWebhook {
				t.Errorf("due event %+v", ev)
			}
			ids = append(ids, ev.ID)
		}
		return ids
	}
	pending := func() int {
		t.Helper()
		n, err := db.CountTruncatedPending(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Stored and acknowledged; nothing mirrored or queued yet.
	if got := emit(t, db, testRoutes, truncated("evt_t1", "pay_9")); got[0] != accepted(false, 0) {
		t.Fatalf("Emit truncated = %+v, want accepted, no mirror, no outbox", got[0])
	}
	clk.Set(t0.Add(time.Second))
	if got := emit(t, db, testRoutes, truncated("evt_t2", "pay_8"), truncated("evt_t1", "pay_9")); !slices.Equal(got, []backstop.EmitResult{accepted(false, 0), duplicate}) {
		t.Fatalf("Emit = %+v", got)
	}
	if n := pending(); n != 2 {
		t.Fatalf("CountTruncatedPending = %d, want 2", n)
	}
	if ids := dueIDs(t0.Add(time.Second)); !slices.Equal(ids, []string{"evt_t1", "evt_t2"}) {
		t.Fatalf("due = %v, want both, oldest first", ids)
	}
	if rows := outboxRows(t, db, ""); len(rows) != 0 {
		t.Fatalf("outbox has %d rows before the fetch", len(rows))
	}

	// A failed fetch backs off.
	retryAt := t0.Add(time.Minute)
	if err := db.FailTruncated(ctx, "evt_t1", "HTTP 503", retryAt); err != nil {
		t.Fatal(err)
	}
	if ids := dueIDs(t0.Add(2 * time.Second)); !slices.Equal(ids, []string{"evt_t2"}) {
		t.Errorf("due before the retry time = %v, want [evt_t2]", ids)
	}
	if ids := dueIDs(retryAt); !slices.Equal(ids, []string{"evt_t1", "evt_t2"}) {
		t.Errorf("due at the retry time = %v, want both", ids)
	}
	pe := mustProcessed(t, db, "evt_t1")
	if !pe.Truncated || pe.FetchAttempts != 1 || pe.LastFetchError != "HTTP 503" || !pe.NextFetchAt.Equal(retryAt) || pe.DedupKey != "" {
		t.Errorf("after a failed fetch: %+v", pe)
	}

	// The fetch succeeds: the event takes the object's version and behaves
	// as if it had arrived whole.
	full := obj(t, backstop.Payments, "pay_9", "2024-05-01T10:00:00Z", map[string]any{"amount": 100, "blob": strings.Repeat("x", 70<<10)})
	res, err := db.CompleteTruncated(ctx, "evt_t1", full, testRoutes)
	if err != nil || res != accepted(true, 2) {
		t.Fatalf("CompleteTruncated = %+v, %v; want accepted, mirrored, 2 outbox rows", res, err)
	}
	if o := mirrored(t, db, backstop.Payments, "pay_9"); !bytes.Equal(o.Data, full.Data) {
		t.Error("mirror does not hold the fetched object")
	}
	pe = mustProcessed(t, db, "evt_t1")
	if pe.Truncated || pe.DedupKey != string(full.Resource)+":pay_9:"+backstop.CanonicalTime(full.UpdatedAt) ||
		!pe.UpdatedAt.Equal(full.UpdatedAt) || !bytes.Equal(pe.Data, full.Data) || !pe.NextFetchAt.IsZero() {
		t.Errorf("after completion: %+v", pe)
	}
	rows := outboxRows(t, db, "billing")
	if len(rows) != 1 || !bytes.Contains(rows[0].Payload, full.Data) || !bytes.Contains(rows[0].Payload, []byte(`"event_id":"evt_t1"`)) {
		t.Errorf("billing outbox = %d rows, want one whose payload carries the full object", len(rows))
	}
	// The webhook for the same version arriving later is a duplicate.
	if got := emit(t, db, testRoutes, payment(t, "evt_same", "pay_9", "2024-05-01T10:00:00.000Z")); got[0] != duplicate {
		t.Errorf("the same version after completion = %+v, want duplicate", got[0])
	}
	// Completing again changes nothing; failing it is refused.
	if res, err := db.CompleteTruncated(ctx, "evt_t1", full, testRoutes); err != nil || res != duplicate {
		t.Errorf("second CompleteTruncated = %+v, %v; want duplicate", res, err)
	}
	if err := db.FailTruncated(ctx, "evt_t1", "late", retryAt); !errors.Is(err, backstop.ErrNotFound) {
		t.Errorf("FailTruncated of a completed event = %v, want ErrNotFound", err)
	}

	// evt_t2's version reaches the store by another path first; completing
	// it then makes it a duplicate of that event.
	other := event(t, "", "payment.succeeded", backstop.OriginReconcile, backstop.Payments, "pay_8", "2024-05-01T10:05:00Z")
	other.ID = backstop.EventID(other.DedupKey())
	emit(t, db, testRoutes, other)
	before := len(outboxRows(t, db, ""))
	fetched := obj(t, backstop.Payments, "pay_8", "2024-05-01T10:05:00.000000Z", map[string]any{"amount": 7})
	if res, err := db.CompleteTruncated(ctx, "evt_t2", fetched, testRoutes); err != nil || res != duplicate {
		t.Fatalf("CompleteTruncated into a known version = %+v, %v; want duplicate", res, err)
	}
	pe = mustProcessed(t, db, "evt_t2")
	if pe.Truncated || pe.DedupKey != "" || pe.DuplicateOf != other.ID {
		t.Errorf("duplicate on completion: %+v, want no dedup key and duplicate_of %s", pe, other.ID)
	}
	if after := len(outboxRows(t, db, "")); after != before {
		t.Errorf("outbox grew from %d to %d rows for a duplicate", before, after)
	}
	if o := mirrored(t, db, backstop.Payments, "pay_8"); !bytes.Equal(o.Data, other.Data) {
		t.Errorf("mirror changed for a duplicate: %s", o.Data)
	}
	if n := pending(); n != 0 {
		t.Errorf("CountTruncatedPending = %d, want 0", n)
	}
	if ids := dueIDs(retryAt.Add(time.Hour)); len(ids) != 0 {
		t.Errorf("due after completion = %v", ids)
	}

	// Errors.
	if _, err := db.CompleteTruncated(ctx, "evt_missing", full, testRoutes); !errors.Is(err, backstop.ErrNotFound) {
		t.Errorf("CompleteTruncated of an unknown id = %v, want ErrNotFound", err)
	}
	emit(t, db, testRoutes, truncated("evt_t3", "pay_7"))
	if _, err := db.CompleteTruncated(ctx, "evt_t3", full, testRoutes); err == nil || !strings.Contains(err.Error(), "pay_7") {
		t.Errorf("CompleteTruncated with another object = %v, want an error naming pay_7", err)
	}
	if pe := mustProcessed(t, db, "evt_t3"); !pe.Truncated {
		t.Error("a refused completion changed the event")
	}
}

func TestEmitRollsBackTheWholeBatch(t *testing.T) {
	db, _ := openTest(t)
	good1 := payment(t, "evt_g1", "pay_1", "2024-05-01T10:00:00Z")
	good2 := event(t, "evt_g2", "contact.updated", backstop.OriginSync, backstop.Contacts, "ct_1", "2024-05-01T10:00:00Z")
	empty := func(t *testing.T) {
		t.Helper()
		if n := countProcessed(t, db); n != 0 {
			t.Errorf("%d processed events stored, want none", n)
		}
		if rows := outboxRows(t, db, ""); len(rows) != 0 {
			t.Errorf("%d outbox rows stored, want none", len(rows))
		}
		for _, r := range backstop.Resources {
			if n, err := db.Count(context.Background(), r); err != nil || n != 0 {
				t.Errorf("Count(%s) = %d, %v; want 0", r, n, err)
			}
		}
	}

	bad := []struct {
		name  string
		event backstop.Event
		want  string
	}{
		{"data not JSON", func() backstop.Event {
			e := payment(t, "evt_bad", "pay_2", "2024-05-01T10:00:00Z")
			e.Data = []byte(`{"id":`)
			return e
		}(), "not valid JSON"},
		{"no origin", func() backstop.Event {
			e := payment(t, "evt_bad", "pay_2", "2024-05-01T10:00:00Z")
			e.Origin = ""
			return e
		}(), "missing origin"},
		{"no id", func() backstop.Event { e := payment(t, "", "pay_2", "2024-05-01T10:00:00Z"); return e }(), "missing event id"},
		{"no updated_at", func() backstop.Event {
			e := payment(t, "evt_bad", "pay_2", "2024-05-01T10:00:00Z")
			e.UpdatedAt = time.Time{}
			return e
		}(), "without updated_at"},
		{"unknown resource", func() backstop.Event {
			e := payment(t, "evt_bad", "pay_2", "2024-05-01T10:00:00Z")
			e.Resource = "widgets"
			return e
		}(), "widgets"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := db.Emit(context.Background(), []backstop.Event{good1, good2, tc.event}, testRoutes)
			if err == nil {
				t.Fatal("Emit succeeded, want an error")
			}
			if msg := err.Error(); !strings.Contains(msg, "event 3 of 3") || !strings.Contains(msg, tc.want) {
				t.Errorf("error %q does not name the event and %q", msg, tc.want)
			}
			empty(t)
		})
	}

	t.Run("cancelled context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := db.Emit(ctx, []backstop.Event{good1, good2}, testRoutes); !errors.Is(err, context.Canceled) {
			t.Errorf("Emit with a cancelled context = %v, want context.Canceled", err)
		}
		empty(t)
	})

	t.Run("empty target", func(t *testing.T) {
		if _, err := db.Emit(context.Background(), []backstop.Event{good1}, []backstop.Route{{Events: []string{"*"}}}); err == nil {
			t.Error("Emit with a route without target succeeded")
		}
		empty(t)
	})

	// The same events commit once the bad one is left out.
	if got := emit(t, db, testRoutes, good1, good2); !slices.Equal(got, []backstop.EmitResult{accepted(true, 2), accepted(true, 2)}) {
		t.Errorf("Emit after the failures = %+v", got)
	}
}

func TestConcurrentEmitOfOneEvent(t *testing.T) {
	db, _ := openFull(t)
	const n = 50
	ev := payment(t, "evt_same", "pay_1", "2024-05-01T10:00:00Z")

	start := make(chan struct{})
	results := make(chan backstop.EmitResult, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-start
			res, err := db.Emit(context.Background(), []backstop.Event{ev}, testRoutes)
			if err != nil {
				errs <- err // "database is locked" would show here
				return
			}
			results <- res[0]
		})
	}
	close(start)
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var acc, dup, writes, queued int
	for r := range results {
		switch r.Status {
		case backstop.EmitAccepted:
			acc++
		case backstop.EmitDuplicate:
			dup++
		}
		if r.MirrorWritten {
			writes++
		}
		queued += r.Outbox
	}
	if acc != 1 || dup != n-1 || writes != 1 || queued != 2 {
		t.Errorf("%d accepted, %d duplicates, %d mirror writes, %d outbox rows; want 1, %d, 1, 2", acc, dup, writes, queued, n-1)
	}
	if c := countProcessed(t, db); c != 1 {
		t.Errorf("CountProcessed = %d, want 1", c)
	}
	if rows := outboxRows(t, db, ""); len(rows) != 2 {
		t.Errorf("%d outbox rows, want 2", len(rows))
	}
}

func TestPruneProcessed(t *testing.T) {
	ctx := context.Background()
	db, clk := openTest(t)
	old := payment(t, "evt_old", "pay_1", "2024-05-01T10:00:00Z")
	oldTruncated := backstop.Event{ID: "evt_trunc", Type: "payment.failed", Resource: backstop.Payments, ObjectID: "pay_2",
		CreatedAt: t0, Origin: backstop.OriginWebhook, Data: json.RawMessage(`{"id":"pay_2"}`), Truncated: true}
	emit(t, db, testRoutes, old, oldTruncated)
	clk.Set(t0.Add(40 * 24 * time.Hour))
	recent := payment(t, "evt_recent", "pay_3", "2024-06-10T10:00:00Z")
	emit(t, db, testRoutes, recent)

	n, err := db.PruneProcessed(ctx, t0.Add(30*24*time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("PruneProcessed = %d, %v; want 1", n, err)
	}
	if _, ok, err := db.ProcessedEvent(ctx, "evt_old"); err != nil {
		t.Fatal(err)
	} else if ok {
		t.Error("evt_old was kept")
	}
	mustProcessed(t, db, "evt_trunc") // still waiting for its object
	mustProcessed(t, db, "evt_recent")
	// Delivery does not depend on processed_events.
	if rows := outboxRows(t, db, ""); len(rows) != 4 {
		t.Errorf("%d outbox rows after pruning, want 4", len(rows))
	}
	if n, err := db.PruneProcessed(ctx, t0.Add(30*24*time.Hour)); err != nil || n != 0 {
		t.Errorf("second PruneProcessed = %d, %v; want 0", n, err)
	}
	// Once pruned, an event is new again; its delivery is not queued twice.
	if got := emit(t, db, testRoutes, old); got[0] != accepted(false, 0) {
		t.Errorf("Emit of a pruned event = %+v, want accepted, mirror unchanged, already queued", got[0])
	}
}

func TestPruneProcessedInChunks(t *testing.T) {
	if testing.Short() {
		t.Skip("emits more than one prune chunk of events")
	}
	ctx := context.Background()
	db, clk := openTest(t)
	const total = pruneChunk*2 + 7
	evs := make([]backstop.Event, total)
	for i := range evs {
		evs[i] = backstop.Event{ID: fmt.Sprintf("evt_%06d", i), Type: "x.y", Origin: backstop.OriginManual, CreatedAt: t0}
	}
	emit(t, db, nil, evs...)
	clk.Set(t0.Add(time.Hour))
	emit(t, db, nil, backstop.Event{ID: "evt_keep", Type: "x.y", Origin: backstop.OriginManual})
	n, err := db.PruneProcessed(ctx, t0.Add(time.Minute))
	if err != nil || n != total {
		t.Fatalf("PruneProcessed = %d, %v; want %d", n, err, total)
	}
	if c := countProcessed(t, db); c != 1 {
		t.Errorf("CountProcessed = %d, want 1", c)
	}
}

func TestClosedDBEventMethodsReturnErrors(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "c.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	ev := payment(t, "evt_1", "pay_1", "2024-05-01T10:00:00Z")
	o, _ := ev.Object()
	calls := map[string]func() error{
		"Emit":                  func() error { _, err := db.Emit(ctx, []backstop.Event{ev}, testRoutes); return err },
		"DueTruncated":          func() error { _, err := db.DueTruncated(ctx, t0, 1); return err },
		"CompleteTruncated":     func() error { _, err := db.CompleteTruncated(ctx, "evt_1", o, testRoutes); return err },
		"FailTruncated":         func() error { return db.FailTruncated(ctx, "evt_1", "x", t0) },
		"CountTruncatedPending": func() error { _, err := db.CountTruncatedPending(ctx); return err },
		"ProcessedEvent":        func() error { _, _, err := db.ProcessedEvent(ctx, "evt_1"); return err },
		"CountProcessed":        func() error { _, err := db.CountProcessed(ctx); return err },
		"OutboxRows":            func() error { _, err := db.OutboxRows(ctx, ""); return err },
		"PruneProcessed":        func() error { _, err := db.PruneProcessed(ctx, t0); return err },
		"Ping":                  func() error { return db.Ping(ctx) },
	}
	for name, call := range calls {
		if err := call(); err == nil {
			t.Errorf("%s on a closed store succeeded, want an error", name)
		}
	}
}

// benchEvents makes n payment events of distinct objects, shaped like the
// platform's webhooks.
func benchEvents(b testing.TB, prefix string, n int) []backstop.Event {
	out := make([]backstop.Event, n)
	for i := range out {
		ts := t0.Add(time.Duration(i) * time.Millisecond).Format(time.RFC3339Nano)
		o := obj(b, backstop.Payments, fmt.Sprintf("pay_%s%07d", prefix, i), ts,
			map[string]any{"contact_id": "ct_1", "amount": 1250, "currency": "PLN", "status": "succeeded"})
		out[i] = backstop.Event{
			ID: fmt.Sprintf("evt_%s%07d", prefix, i), Type: "payment.succeeded", Resource: backstop.Payments,
			ObjectID: o.ID, UpdatedAt: o.UpdatedAt, CreatedAt: o.UpdatedAt, Origin: backstop.OriginWebhook, Data: o.Data,
		}
	}
	return out
}

// BenchmarkEmit compares Emit with 100 events per transaction (what group
// commit does) against one event per transaction, both with
// synchronous=FULL, on the same number of new payment events with two
// matching routes, and prints one BENCH line.
func BenchmarkEmit(b *testing.B) {
	const events, batch = 2000, 100
	ctx := context.Background()
	routes := testRoutes[:3] // billing and audit match payments
	var batched, single time.Duration
	for range b.N {
		for _, size := range []int{batch, 1} {
			db, _ := openFull(b)
			evs := benchEvents(b, fmt.Sprint(size), events)
			start := time.Now()
			for i := 0; i < len(evs); i += size {
				res, err := db.Emit(ctx, evs[i:i+size], routes)
				if err != nil {
					b.Fatal(err)
				}
				if res[0].Status != backstop.EmitAccepted || res[0].Outbox != 2 {
					b.Fatalf("result %+v", res[0])
				}
			}
			if size == 1 {
				single += time.Since(start)
			} else {
				batched += time.Since(start)
			}
		}
	}
	n := float64(b.N * events)
	b.ReportMetric(n/batched.Seconds(), "events/s")
	fmt.Printf("BENCH store-emit events=%d batch_per_s=%.0f single_per_s=%.0f ratio=%.2f\n",
		events, n/batched.Seconds(), n/single.Seconds(), single.Seconds()/batched.Seconds())
}

// OldestEventAt tells since when the store has recorded a resource's
// events: the oldest received_at among them, whatever the other
// resources hold; none for a resource without events.
func TestOldestEventAt(t *testing.T) {
	db, clk := openTest(t)
	ctx := context.Background()
	clk.Set(t0.Add(time.Hour))
	emit(t, db, nil, event(t, "evt_c1", "contact.created", backstop.OriginWebhook, backstop.Contacts, "ct_1", "2024-05-01T09:00:00Z"))
	clk.Set(t0.Add(2 * time.Hour))
	emit(t, db, nil, payment(t, "evt_p1", "pay_1", "2024-05-01T09:00:00Z"))
	clk.Set(t0.Add(3 * time.Hour))
	emit(t, db, nil, payment(t, "evt_p2", "pay_2", "2024-05-01T09:30:00Z"))
	for _, c := range []struct {
		r    backstop.Resource
		want time.Time
		ok   bool
	}{
		{backstop.Contacts, t0.Add(time.Hour), true},
		{backstop.Payments, t0.Add(2 * time.Hour), true},
		{backstop.Chats, time.Time{}, false},
	} {
		got, ok, err := db.OldestEventAt(ctx, c.r)
		if err != nil || ok != c.ok || !got.Equal(c.want) {
			t.Errorf("OldestEventAt(%s) = %v, %v, %v; want %v, %v", c.r, got, ok, err, c.want, c.ok)
		}
	}
}

// The envelope writes its strings as json.Marshal does (targets may
// compare its bytes with an earlier delivery's), on the fast path for
// plain ids and through json.Marshal for any other.
func TestEnvelopeStringsAreJSONMarshals(t *testing.T) {
	quote := func(s string) string {
		q, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		return string(q)
	}
	created := time.Date(2026, 3, 1, 10, 0, 0, 120000000, time.FixedZone("x", 3600))
	for _, s := range []string{
		"evt_1", "payment.succeeded", "", "a b", "<script>", "a&b", `q"uote`, `back\slash`,
		"tab\there", "del\x7f", "zażółć", "bad\xffutf8", "\u2028line", "evt_" + strings.Repeat("x", 200),
	} {
		ev := backstop.Event{ID: s, Type: s, Origin: backstop.Origin(s), CreatedAt: created, Data: json.RawMessage(`{"a":1}`)}
		want := `{"event_id":` + quote(s) + `,"event":` + quote(s) + `,"created_at":` + quote(created.UTC().Format(time.RFC3339Nano)) +
			`,"origin":` + quote(s) + `,"data":{"a":1}}`
		if got := string(envelope(ev)); got != want {
			t.Errorf("envelope for %q:\n got %s\nwant %s", s, got, want)
		}
	}
}

// A batch's outbox rows go in by multi-row statements: every row is
// queued in the order of its event, across the statements' sizes, and an
// event queued already to some of its targets (its processed_events row
// pruned while its deliveries are kept) counts only the others, whatever
// its place in the batch.
func TestEmitQueuesABatchInOrderAndCountsWhatWasQueuedAlready(t *testing.T) {
	ctx := context.Background()
	db, clk := openTest(t)
	routes := testRoutes[:3] // billing and audit match payments
	old := payment(t, "evt_old", "pay_old", "2024-05-01T10:00:00Z")
	both := payment(t, "evt_both", "pay_both", "2024-05-01T10:00:00Z")
	emit(t, db, routes, old, both)
	// Delivered long ago and pruned: old keeps its billing delivery only,
	// both keeps both.
	if _, err := db.w.ExecContext(ctx, `DELETE FROM outbox WHERE event_id = 'evt_old' AND target = 'audit'`); err != nil {
		t.Fatal(err)
	}
	clk.Set(t0.Add(40 * 24 * time.Hour))
	if n, err := db.PruneProcessed(ctx, t0.Add(30*24*time.Hour)); err != nil || n != 2 {
		t.Fatalf("PruneProcessed = %d, %v; want 2", n, err)
	}

	// 37 events of two rows each: 74 rows, 32 + 32 + 8 + 2 in statements.
	evs := benchEvents(t, "b", 35)
	batch := append([]backstop.Event{evs[0], old}, evs[1:]...)
	batch = append(batch[:20], append([]backstop.Event{both}, batch[20:]...)...)
	res, err := db.Emit(ctx, batch, routes)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		want := 2
		switch batch[i].ID {
		case "evt_old":
			want = 1 // audit again, not billing
		case "evt_both":
			want = 0
		}
		if r.Status != backstop.EmitAccepted || r.Outbox != want {
			t.Errorf("event %d (%s): %+v, want accepted with %d deliveries queued", i, batch[i].ID, r, want)
		}
	}
	rows := outboxRows(t, db, "")
	if len(rows) != 4-1+1+35*2 {
		t.Fatalf("%d outbox rows, want %d", len(rows), 4-1+1+35*2)
	}
	// The batch's rows follow its events, each event's in route order.
	var got []string
	for _, r := range rows[3:] {
		got = append(got, r.EventID+">"+r.Target)
	}
	var want []string
	for _, ev := range batch {
		for _, tgt := range []string{"billing", "audit"} {
			if ev.ID == "evt_both" || ev.ID == "evt_old" && tgt == "billing" {
				continue
			}
			want = append(want, ev.ID+">"+tgt)
		}
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("outbox rows of the batch in id order:\n %v\nwant\n %v", got, want)
	}
}

// One Emit of a batch decides each event as Emits of its events one at a
// time would (its statements go row by row over the batch): the same
// results and the same rows in processed_events, the mirror and the
// outbox, for batches full of repeated ids, repeated versions under other
// ids, older versions, unknown types and truncated events, on a store that
// already holds some of them, and across the batch statements' sizes.
func TestEmitOfABatchDecidesAsOneEventAtATime(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 21))
	routes := testRoutes[:3]
	pick := func(n int) []backstop.Event {
		evs := make([]backstop.Event, n)
		for i := range evs {
			id := fmt.Sprintf("evt_%d", rng.IntN(40))
			pay := fmt.Sprintf("pay_%d", rng.IntN(8))
			at := fmt.Sprintf("2024-05-01T10:00:0%dZ", rng.IntN(5))
			switch rng.IntN(10) {
			case 0:
				evs[i] = backstop.Event{ID: id, Type: "invoice.sent", Origin: backstop.OriginWebhook, CreatedAt: t0, Data: json.RawMessage(`{"n":1}`)}
			case 1:
				evs[i] = backstop.Event{ID: id, Type: "payment.failed", Resource: backstop.Payments, ObjectID: pay,
					CreatedAt: t0, Origin: backstop.OriginWebhook, Data: json.RawMessage(`{"id":"` + pay + `"}`), Truncated: true}
			default:
				evs[i] = payment(t, id, pay, at)
			}
		}
		return evs
	}
	for round := range 20 {
		before, batch := pick(rng.IntN(10)), pick(1+rng.IntN(80))
		one, _ := openTest(t)
		all, _ := openTest(t)
		for _, db := range []*DB{one, all} {
			for _, ev := range before {
				emit(t, db, routes, ev)
			}
		}
		var want []backstop.EmitResult
		for _, ev := range batch {
			want = append(want, emit(t, one, routes, ev)...)
		}
		got := emit(t, all, routes, batch...)
		for i := range batch {
			if got[i] != want[i] {
				t.Errorf("round %d, event %d (%s %s): batch %+v, one at a time %+v", round, i, batch[i].ID, batch[i].DedupKey(), got[i], want[i])
			}
		}
		dump := func(db *DB) string {
			var out []string
			for _, q := range []string{
				`SELECT event_id || ' ' || coalesce(dedup_key, '-') || ' ' || truncated FROM processed_events ORDER BY rowid`,
				`SELECT id || ' ' || updated_at FROM payments ORDER BY id`,
				`SELECT target || ' ' || event_id FROM outbox ORDER BY id`,
			} {
				var rows []string
				if err := db.r.SelectContext(ctx, &rows, q); err != nil {
					t.Fatal(err)
				}
				out = append(out, strings.Join(rows, "; "))
			}
			return strings.Join(out, "\n")
		}
		if g, w := dump(all), dump(one); g != w {
			t.Errorf("round %d: the store after the batch:\n%s\nafter one at a time:\n%s", round, g, w)
		}
	}
}

// Two routes to one target queue one delivery of an event and count one.
func TestEmitTwoRoutesToOneTargetQueueOnce(t *testing.T) {
	db, _ := openTest(t)
	routes := []backstop.Route{
		{Target: "billing", Events: []string{"payment.*"}},
		{Target: "audit", Events: []string{"*"}},
		{Target: "billing", Events: []string{"*"}},
	}
	evs := []backstop.Event{payment(t, "evt_1", "pay_1", "2024-05-01T10:00:00Z"), payment(t, "evt_2", "pay_2", "2024-05-01T10:00:00Z")}
	for i, r := range emit(t, db, routes, evs...) {
		if r != accepted(true, 2) {
			t.Errorf("event %d: %+v, want accepted with 2 deliveries", i, r)
		}
	}
	if rows := outboxRows(t, db, "billing"); len(rows) != 2 {
		t.Errorf("billing has %d rows, want 2", len(rows))
	}
}
