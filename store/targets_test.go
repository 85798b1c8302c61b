package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
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

// queryPlan returns the details of EXPLAIN QUERY PLAN of q.
func queryPlan(t *testing.T, db *DB, q string, args ...any) []string {
	t.Helper()
	var rows []struct {
		ID      int    `db:"id"`
		Parent  int    `db:"parent"`
		NotUsed int    `db:"notused"`
		Detail  string `db:"detail"`
	}
	if err := db.r.SelectContext(context.Background(), &rows, "EXPLAIN QUERY PLAN "+q, args...); err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.Detail
	}
	return out
}

// The dashboard lists the targets on every delivery page: the targets
// with rows are found with one index search per target, and their pause
// and disabled state from target_state, neither scanning the outbox (a
// scan of its 3 million rows took most of a second).
func TestTargetNamesAndSettingsDoNotScanTheOutbox(t *testing.T) {
	db, clk := openTest(t)
	ctx := context.Background()
	now := clk.Now()
	for i, target := range []string{"b", "a", "c", "a", "b"} {
		enqueue(t, db, target, fmt.Sprintf("evt_%d", i), "payment.succeeded", now)
	}
	if err := db.DisableTarget(ctx, "b", "answered 410 Gone", now); err != nil {
		t.Fatal(err)
	}
	if err := db.PauseTarget(ctx, "c", now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.w.ExecContext(ctx, `ANALYZE`); err != nil {
		t.Fatal(err)
	}

	names, err := db.TargetsWithRows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b", "c"}; !slices.Equal(names, want) {
		t.Errorf("TargetsWithRows = %v, want %v", names, want)
	}
	gone, err := db.UnconfiguredTargetNames(ctx, []string{"a", "d"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"b", "c"}; !slices.Equal(gone, want) {
		t.Errorf("UnconfiguredTargetNames = %v, want %v", gone, want)
	}
	settings, err := db.TargetSettings(ctx, []string{"a", "b", "c", "d"})
	if err != nil {
		t.Fatal(err)
	}
	if len(settings) != 4 || settings[0].Disabled || !settings[1].Disabled || settings[1].DisabledReason != "answered 410 Gone" ||
		!settings[2].PausedUntil.Equal(now.Add(time.Hour)) || settings[3].Name != "d" || settings[0].Pending != 0 {
		t.Errorf("TargetSettings = %+v", settings)
	}

	for _, c := range []struct {
		name string
		q    string
		args []any
	}{
		{"TargetsWithRows", targetsWithRowsSQL, nil},
		{"TargetSettings", targetSettingsSQL + placeholders(2) + `)`, []any{"a", "b"}},
	} {
		plan := queryPlan(t, db, c.q, c.args...)
		for _, step := range plan {
			if strings.HasPrefix(step, "SCAN ") && strings.Contains(step, "outbox") {
				t.Errorf("%s scans: %q (plan %q)", c.name, step, plan)
			}
		}
		t.Logf("%s: %q", c.name, plan)
	}
}
