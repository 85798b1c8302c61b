package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
)

func TestQuotaAndIntakeSamples(t *testing.T) {
	db, _ := openTest(t)
	ctx := context.Background()
	samples := []QuotaSample{
		{KeyID: "k1", At: t0, Limit: 600, Remaining: 590, Reset: t0.Add(time.Minute), Requests: 10, ThrottleWait: 1500 * time.Millisecond},
		{KeyID: "k1", At: t0.Add(time.Minute), Limit: 600, Remaining: 0, Reset: t0.Add(2 * time.Minute),
			PausedUntil: t0.Add(90 * time.Second), Requests: 600, RateLimited: 3},
		{KeyID: "k2", At: t0.Add(time.Hour), Limit: 30, Remaining: 30},
	}
	for _, s := range samples {
		if err := db.SaveQuotaSample(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.SaveQuotaSample(ctx, QuotaSample{At: t0}); err == nil {
		t.Error("a sample without a key id was saved")
	}
	got, err := db.QuotaSamples(ctx, t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, samples[1:]) {
		t.Errorf("QuotaSamples = %+v\nwant %+v", got, samples[1:])
	}
	for _, s := range []IntakeSample{{At: t0, Duplicates: 2}, {At: t0.Add(time.Minute), SignatureFailures: 5}} {
		if err := db.SaveIntakeSample(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	n, err := db.PruneSamples(ctx, t0.Add(time.Second))
	if err != nil || n != 2 {
		t.Fatalf("PruneSamples = %d, %v; want 2 (one of each)", n, err)
	}
	in, err := db.IntakeSamples(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []IntakeSample{{At: t0.Add(time.Minute), SignatureFailures: 5}}; !reflect.DeepEqual(in, want) {
		t.Errorf("IntakeSamples after prune = %+v, want %+v", in, want)
	}
}

func TestProcessedByPeriod(t *testing.T) {
	db, clk := openTest(t)
	ctx := context.Background()
	emit := func(at time.Time, origin backstop.Origin, n int) {
		t.Helper()
		clk.Set(at)
		for i := range n {
			id := fmt.Sprintf("ct_%s_%d_%d", origin, at.Unix(), i)
			ev := backstop.Event{ID: "evt_" + id, Type: "contact.created", Resource: backstop.Contacts, ObjectID: id,
				UpdatedAt: at, CreatedAt: at, Origin: origin, Data: json.RawMessage(`{"id":"` + id + `"}`)}
			if _, err := db.Emit(ctx, []backstop.Event{ev}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	emit(t0.Add(-time.Hour), backstop.OriginWebhook, 4) // before the window
	emit(t0.Add(5*time.Minute), backstop.OriginWebhook, 3)
	emit(t0.Add(59*time.Minute), backstop.OriginReconcile, 1)
	emit(t0.Add(61*time.Minute), backstop.OriginWebhook, 2)
	got, err := db.ProcessedByPeriod(ctx, t0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	want := []OriginCount{
		{Start: t0, Origin: backstop.OriginReconcile, Events: 1},
		{Start: t0, Origin: backstop.OriginWebhook, Events: 3},
		{Start: t0.Add(time.Hour), Origin: backstop.OriginWebhook, Events: 2},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ProcessedByPeriod = %+v\nwant %+v", got, want)
	}
	if _, err := db.ProcessedByPeriod(ctx, t0, time.Millisecond); err == nil {
		t.Error("a period under a second was accepted")
	}
}

// A retry submitted twice from the same page requeues once.
func TestRetryDeliveryAsSeen(t *testing.T) {
	db, _ := openTest(t)
	ctx := context.Background()
	id := enqueue(t, db, "billing", "evt_1", "payment.succeeded", t0)
	record(t, db, Attempt{DeliveryID: id, Target: "billing", URL: "http://x", Attempt: 1, StatusCode: 400, At: t0},
		Outcome{Status: StatusDeadLetter})
	seen := mustDelivery(t, db, id)

	ok, err := db.RetryDeliveryAsSeen(ctx, id, seen.Status, seen.UpdatedAt, t0.Add(time.Minute))
	if err != nil || !ok {
		t.Fatalf("first retry = %v, %v; want it done", ok, err)
	}
	row := mustDelivery(t, db, id)
	if row.Status != StatusPending || row.Attempts != 1 || row.Failures != 0 || row.LastStatus != 400 {
		t.Errorf("after retry: %+v, want pending with no failures, its attempt still counted and the last status kept", row)
	}
	ok, err = db.RetryDeliveryAsSeen(ctx, id, seen.Status, seen.UpdatedAt, t0.Add(time.Minute+time.Second))
	if err != nil || ok {
		t.Fatalf("second retry of the same view = %v, %v; want nothing done", ok, err)
	}
	if again := mustDelivery(t, db, id); !again.UpdatedAt.Equal(row.UpdatedAt) {
		t.Errorf("the second retry changed the delivery: updated %v, was %v", again.UpdatedAt, row.UpdatedAt)
	}
	if _, err := db.RetryDeliveryAsSeen(ctx, 999, StatusDeadLetter, t0, t0); !errors.Is(err, backstop.ErrNotFound) {
		t.Errorf("retry of an unknown delivery: %v, want ErrNotFound", err)
	}
}

func TestRevokedSessions(t *testing.T) {
	db, _ := openFull(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	if err := db.RevokeSession(ctx, "s1", now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := db.RevokeSession(ctx, "s1", now.Add(time.Hour)); err != nil {
		t.Fatalf("revoking twice: %v", err)
	}
	if err := db.RevokeSession(ctx, "s2", now.Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{"s1": true, "s2": true, "s3": false} {
		if got, err := db.SessionRevoked(ctx, id); err != nil || got != want {
			t.Errorf("SessionRevoked(%s) = %v, %v; want %v", id, got, err, want)
		}
	}
	if n, err := db.PruneRevokedSessions(ctx, now); err != nil || n != 1 {
		t.Fatalf("prune: %d, %v; want the expired one", n, err)
	}
	if got, _ := db.SessionRevoked(ctx, "s1"); !got {
		t.Error("an unexpired revocation was pruned")
	}
}

// The delivery log pages by id: the page after a row lists the rows older
// than it, whatever was queued since; the page before a row the oldest
// rows newer than it, newest first. Its window leaves out old delivered
// rows only.
func TestDeliveryLogPagesByID(t *testing.T) {
	db, clk := openTest(t)
	ctx := context.Background()
	now := clk.Now()
	var ids []int64
	for i := range 5 {
		ids = append(ids, enqueue(t, db, "a1", fmt.Sprintf("evt_%d", i), "payment.succeeded", now))
	}
	list := func(f LogFilter) []int64 {
		t.Helper()
		rows, err := db.DeliveryLog(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]int64, len(rows))
		for i, r := range rows {
			out[i] = r.ID
		}
		return out
	}
	first := list(LogFilter{Limit: 2})
	enqueue(t, db, "a1", "evt_new", "payment.succeeded", now)
	second := list(LogFilter{Limit: 2, Before: first[len(first)-1]})
	if want := []int64{ids[4], ids[3]}; !reflect.DeepEqual(first, want) {
		t.Errorf("first page %v, want %v", first, want)
	}
	if want := []int64{ids[2], ids[1]}; !reflect.DeepEqual(second, want) {
		t.Errorf("the page after %d, with a row queued since: %v, want %v", first[1], second, want)
	}
	if got, want := list(LogFilter{Limit: 2, After: ids[2]}), []int64{ids[4], ids[3]}; !reflect.DeepEqual(got, want) {
		t.Errorf("the page before %d: %v, want %v", ids[2], got, want)
	}
	if _, err := db.DeliveryLog(ctx, LogFilter{Before: 3, After: 1}); err == nil {
		t.Error("DeliveryLog before and after a row did not fail")
	}

	old := now.Add(-30 * 24 * time.Hour)
	oldPending := enqueue(t, db, "a2", "evt_old_pending", "payment.succeeded", old)
	oldDelivered := enqueue(t, db, "a2", "evt_old_delivered", "payment.succeeded", old)
	record(t, db, Attempt{DeliveryID: oldDelivered, Target: "a2", URL: "http://a2.invalid/", Attempt: 1, StatusCode: 200,
		RequestID: "r1", At: old}, Outcome{Status: StatusDelivered})
	got := list(LogFilter{Target: "a2", DeliveredSince: now.Add(-14 * 24 * time.Hour)})
	if want := []int64{oldPending}; !reflect.DeepEqual(got, want) {
		t.Errorf("a2's rows in the 14-day window: %v, want the old pending one %v alone", got, want)
	}
}

// LastAttempts reads a delivery's last n attempts, oldest first, with the
// total, through the delivery's index: without a scan or a sort of all its
// attempts.
func TestLastAttemptsReadsOnlyTheLast(t *testing.T) {
	db, clk := openTest(t)
	ctx := context.Background()
	now := clk.Now()
	id := enqueue(t, db, "a1", "evt_1", "payment.succeeded", now)
	other := enqueue(t, db, "a1", "evt_2", "payment.succeeded", now)
	for i := 1; i <= 30; i++ {
		record(t, db, Attempt{DeliveryID: id, Target: "a1", URL: "http://a1.invalid/", Attempt: i, StatusCode: 429,
			RequestID: fmt.Sprintf("r%d", i), At: now.Add(time.Duration(i) * time.Second)},
			Outcome{Status: StatusRetrying, NextAttemptAt: now.Add(time.Hour)})
	}
	record(t, db, Attempt{DeliveryID: other, Target: "a1", URL: "http://a1.invalid/", Attempt: 1, StatusCode: 200,
		RequestID: "o1", At: now}, Outcome{Status: StatusDelivered})
	last, total, err := db.LastAttempts(ctx, id, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, a := range last {
		got = append(got, a.Attempt)
	}
	if want := []int{21, 22, 23, 24, 25, 26, 27, 28, 29, 30}; total != 30 || !reflect.DeepEqual(got, want) {
		t.Errorf("LastAttempts = %v of %d, want %v of 30", got, total, want)
	}
	if last, total, err := db.LastAttempts(ctx, other, 10); err != nil || total != 1 || len(last) != 1 || last[0].RequestID != "o1" {
		t.Errorf("LastAttempts of a delivery with one attempt = %+v of %d, %v", last, total, err)
	}
	for _, q := range []string{lastAttemptsSQL, lastAttemptsCountSQL} {
		args := []any{id, 10}
		if q == lastAttemptsCountSQL {
			args = args[:1]
		}
		plan := queryPlan(t, db, q, args...)
		for _, step := range plan {
			if strings.HasPrefix(step, "SCAN") || strings.Contains(step, "TEMP B-TREE") {
				t.Errorf("%s: plan %q reads or sorts every attempt", q, plan)
			}
		}
	}
}
