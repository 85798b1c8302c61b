package store

import (
	"context"
	"slices"
	"testing"
	"time"
)

// A target removed from the configuration keeps its rows: UnconfiguredTargets
// finds it with its counts, and PurgeTarget deletes its rows of every
// status with their attempts, leaving the other targets' rows alone.
func TestUnconfiguredTargetsAndPurgeTarget(t *testing.T) {
	db, clk := openTest(t)
	ctx := context.Background()
	now := clk.Now()
	pending := enqueue(t, db, "a1", "evt_1", "payment.succeeded", now)
	retrying := enqueue(t, db, "a1", "evt_2", "payment.succeeded", now)
	record(t, db, Attempt{DeliveryID: retrying, Target: "a1", URL: "http://a1.invalid/", Attempt: 1, StatusCode: 503,
		RequestID: "r1", At: now}, Outcome{Status: StatusRetrying, NextAttemptAt: now.Add(time.Minute)})
	dead := enqueue(t, db, "a1", "evt_3", "payment.succeeded", now)
	record(t, db, Attempt{DeliveryID: dead, Target: "a1", URL: "http://a1.invalid/", Attempt: 1, StatusCode: 400,
		RequestID: "r2", At: now}, Outcome{Status: StatusDeadLetter})
	enqueue(t, db, "a2", "evt_1", "payment.succeeded", now)
	kept := enqueue(t, db, "a3", "evt_1", "payment.succeeded", now)
	if err := db.PauseTarget(ctx, "a1", now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}

	names, err := db.TargetsWithRows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a1", "a2", "a3"}; !slices.Equal(names, want) {
		t.Errorf("TargetsWithRows = %v, want %v", names, want)
	}
	gone, err := db.UnconfiguredTargets(ctx, []string{"a3", "a4"})
	if err != nil {
		t.Fatal(err)
	}
	if len(gone) != 2 || gone[0].Name != "a1" || gone[1].Name != "a2" {
		t.Fatalf("UnconfiguredTargets = %+v, want a1 and a2", gone)
	}
	if g := gone[0]; g.Pending != 1 || g.Retrying != 1 || g.DeadLetter != 1 || g.Delivered != 0 {
		t.Errorf("a1 counts: %+v, want 1 pending, 1 retrying, 1 dead letter", g)
	}
	if g := gone[1]; g.Pending != 1 {
		t.Errorf("a2 counts: %+v, want 1 pending", g)
	}

	n, err := db.PurgeTarget(ctx, "a1")
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Errorf("PurgeTarget(a1) = %d, want 3", n)
	}
	for _, id := range []int64{pending, retrying, dead} {
		if _, ok, err := db.Delivery(ctx, id); err != nil || ok {
			t.Errorf("delivery %d of a1 after the purge: ok %v, err %v; want gone", id, ok, err)
		}
		if as, err := db.Attempts(ctx, id); err != nil || len(as) != 0 {
			t.Errorf("delivery %d of a1 after the purge: %d attempts (%v), want none", id, len(as), err)
		}
	}
	mustDelivery(t, db, kept)
	gone, err = db.UnconfiguredTargets(ctx, []string{"a3"})
	if err != nil {
		t.Fatal(err)
	}
	if len(gone) != 1 || gone[0].Name != "a2" {
		t.Errorf("after purging a1, UnconfiguredTargets = %+v, want a2 only", gone)
	}
	st, err := db.TargetStates(ctx, []string{"a1"})
	if err != nil {
		t.Fatal(err)
	}
	if !st[0].PausedUntil.IsZero() {
		t.Errorf("a1's pause survived the purge: %v", st[0].PausedUntil)
	}
	if _, err := db.PurgeTarget(ctx, ""); err == nil {
		t.Error("PurgeTarget with an empty target did not fail")
	}
}
