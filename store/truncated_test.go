package store

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
)

// Two processes on one store file claim a due truncated event: exactly one
// of them gets it, nobody gets it again while the lease lasts, and it is due
// again once the lease ends (its holder died). A failure is recorded only by
// the holder of the current lease, and its backoff is computed from the
// stored attempts, whichever process records it.
func TestClaimTruncatedAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "backstop.db")
	open := func() *DB {
		t.Helper()
		db, err := Open(ctx, path, Options{Now: func() time.Time { return t0 }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	a, b := open(), open()
	ev := backstop.Event{ID: "evt_big", Type: "payment.succeeded", Resource: backstop.Payments, ObjectID: "pay_1",
		CreatedAt: t0, Origin: backstop.OriginWebhook, Data: json.RawMessage(`{"id":"pay_1"}`), Truncated: true}
	if got := emit(t, a, testRoutes, ev); got[0] != accepted(false, 0) {
		t.Fatalf("Emit truncated = %+v", got[0])
	}

	const lease = time.Minute
	now := t0.Add(time.Second)
	// Eight fetchers, four per process, claim at once: one wins.
	var (
		mu     sync.Mutex
		claims []backstop.Event
		wg     sync.WaitGroup
	)
	for i := range 8 {
		db := a
		if i%2 == 1 {
			db = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			evs, err := db.ClaimTruncated(ctx, now, 10, lease)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			claims = append(claims, evs...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(claims) != 1 || claims[0].ID != "evt_big" || !claims[0].Truncated || claims[0].ObjectID != "pay_1" {
		t.Fatalf("8 concurrent claims got %+v, want evt_big once", claims)
	}
	claimOf := func(db *DB, at time.Time) []backstop.Event {
		t.Helper()
		evs, err := db.ClaimTruncated(ctx, at, 10, lease)
		if err != nil {
			t.Fatal(err)
		}
		return evs
	}
	lease1 := now.Add(lease)
	if pe := mustProcessed(t, b, "evt_big"); !pe.NextFetchAt.Equal(lease1) || pe.FetchAttempts != 0 {
		t.Fatalf("claimed event: %+v, want next fetch at the lease's end %v", pe, lease1)
	}
	if evs := claimOf(b, lease1.Add(-time.Nanosecond)); len(evs) != 0 {
		t.Fatalf("claimed again during the lease: %+v", evs)
	}
	// Its holder died: at the lease's end the other process claims it.
	now2 := lease1
	if evs := claimOf(b, now2); len(evs) != 1 {
		t.Fatalf("claim at the lease's end = %+v, want the event again", evs)
	}
	lease2 := now2.Add(lease)

	// The dead holder's lease is gone: its late failure changes nothing.
	called := false
	if _, err := a.FailClaimedTruncated(ctx, "evt_big", lease1, "late", func(int) time.Time { called = true; return now }); !errors.Is(err, backstop.ErrNotFound) || called {
		t.Fatalf("failure under a lost lease = %v (backoff asked: %v), want ErrNotFound", err, called)
	}
	// The holder's failure counts from the stored attempts.
	backoff := func(n int) time.Time { return now2.Add(time.Duration(n) * time.Hour) }
	if n, err := b.FailClaimedTruncated(ctx, "evt_big", lease2, "HTTP 404", backoff); err != nil || n != 1 {
		t.Fatalf("FailClaimedTruncated = %d, %v; want attempt 1", n, err)
	}
	pe := mustProcessed(t, a, "evt_big")
	if pe.FetchAttempts != 1 || pe.LastFetchError != "HTTP 404" || !pe.NextFetchAt.Equal(now2.Add(time.Hour)) || !pe.Truncated {
		t.Fatalf("after a failure: %+v", pe)
	}
	// The other process's next attempt is the second.
	now3 := pe.NextFetchAt
	if evs := claimOf(a, now3); len(evs) != 1 {
		t.Fatalf("claim when the retry is due = %+v", evs)
	}
	if n, err := a.FailClaimedTruncated(ctx, "evt_big", now3.Add(lease), "HTTP 404", backoff); err != nil || n != 2 {
		t.Fatalf("second failure = %d, %v; want attempt 2", n, err)
	}
	if pe := mustProcessed(t, b, "evt_big"); pe.FetchAttempts != 2 || !pe.NextFetchAt.Equal(now2.Add(2*time.Hour)) {
		t.Fatalf("after the second failure: %+v", pe)
	}

	// A fetcher stopping hands its claim back: due at once, attempts kept.
	now4 := now2.Add(2 * time.Hour)
	if evs := claimOf(b, now4); len(evs) != 1 {
		t.Fatalf("claim = %+v", evs)
	}
	if ok, err := b.ReleaseTruncated(ctx, "evt_big", lease1, now4); err != nil || ok {
		t.Fatalf("release under a lost lease = %v, %v; want nothing released", ok, err)
	}
	if ok, err := b.ReleaseTruncated(ctx, "evt_big", now4.Add(lease), now4); err != nil || !ok {
		t.Fatalf("release = %v, %v; want released", ok, err)
	}
	if pe := mustProcessed(t, a, "evt_big"); pe.FetchAttempts != 2 || !pe.NextFetchAt.Equal(now4) {
		t.Fatalf("after release: %+v", pe)
	}

	// Completed by one process; a second completion (a fetch whose lease
	// ran out) changes nothing, and nothing is claimed any more.
	if evs := claimOf(a, now4); len(evs) != 1 {
		t.Fatalf("claim after release = %+v", evs)
	}
	full := obj(t, backstop.Payments, "pay_1", "2024-05-01T10:00:00Z", map[string]any{"blob": strings.Repeat("x", 70<<10)})
	if res, err := a.CompleteTruncated(ctx, "evt_big", full, testRoutes); err != nil || res != accepted(true, 2) {
		t.Fatalf("CompleteTruncated = %+v, %v", res, err)
	}
	if res, err := b.CompleteTruncated(ctx, "evt_big", full, testRoutes); err != nil || res != duplicate {
		t.Fatalf("second CompleteTruncated = %+v, %v; want a duplicate", res, err)
	}
	if rows := outboxRows(t, b, ""); len(rows) != 2 {
		t.Errorf("outbox has %d rows, want 2 (one per route, once)", len(rows))
	}
	if evs := claimOf(b, now4.Add(24*time.Hour)); len(evs) != 0 {
		t.Errorf("completed event claimed: %+v", evs)
	}
	if _, err := a.ClaimTruncated(ctx, now, 0, lease); err == nil {
		t.Error("claim with no limit accepted")
	}
	if _, err := a.ClaimTruncated(ctx, now, 1, 0); err == nil {
		t.Error("claim with no lease accepted")
	}
}

// A truncated event listed for its fetch carries its created_at, or the
// time it arrived when created_at is later (the sender's clock is ahead):
// the fetch worker gives a missing object up a grace after it.
func TestDueTruncatedCreatedAtIsNeverAfterArrival(t *testing.T) {
	ctx := context.Background()
	db, err := Open(ctx, filepath.Join(t.TempDir(), "backstop.db"), Options{Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ahead := backstop.Event{ID: "evt_ahead", Type: "payment.succeeded", Resource: backstop.Payments, ObjectID: "pay_1",
		CreatedAt: t0.AddDate(1, 0, 0), Origin: backstop.OriginWebhook, Data: json.RawMessage(`{"id":"pay_1"}`), Truncated: true}
	behind := ahead
	behind.ID, behind.ObjectID, behind.CreatedAt, behind.Data = "evt_behind", "pay_2", t0.Add(-time.Hour), json.RawMessage(`{"id":"pay_2"}`)
	emit(t, db, testRoutes, ahead, behind)

	want := map[string]time.Time{"evt_ahead": t0, "evt_behind": t0.Add(-time.Hour)}
	check := func(how string, evs []backstop.Event) {
		t.Helper()
		if len(evs) != 2 {
			t.Fatalf("%s: %d events, want 2", how, len(evs))
		}
		for _, ev := range evs {
			if !ev.CreatedAt.Equal(want[ev.ID]) {
				t.Errorf("%s: %s created_at %v, want %v", how, ev.ID, ev.CreatedAt, want[ev.ID])
			}
		}
	}
	due, err := db.DueTruncated(ctx, t0, 0)
	if err != nil {
		t.Fatal(err)
	}
	check("DueTruncated", due)
	claimed, err := db.ClaimTruncated(ctx, t0, 10, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	check("ClaimTruncated", claimed)
	// The event itself keeps the created_at it came with.
	if pe, ok, err := db.ProcessedEvent(ctx, "evt_ahead"); err != nil || !ok || !pe.CreatedAt.Equal(ahead.CreatedAt) {
		t.Errorf("stored evt_ahead: %+v %v %v, want created_at %v kept", pe, ok, err, ahead.CreatedAt)
	}
}
