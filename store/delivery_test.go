package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
)

// enqueue queues a delivery of evt to target at now and returns its id.
func enqueue(t *testing.T, db *DB, target, eventID, eventType string, now time.Time) int64 {
	t.Helper()
	payload := fmt.Sprintf(`{"event_id":%q,"event":%q,"data":{}}`, eventID, eventType)
	id, err := db.Enqueue(context.Background(), target, eventID, eventType, json.RawMessage(payload), now)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func mustDelivery(t *testing.T, db *DB, id int64) OutboxRow {
	t.Helper()
	row, ok, err := db.Delivery(context.Background(), id)
	if err != nil || !ok {
		t.Fatalf("Delivery(%d) = %v, %v; want the row", id, ok, err)
	}
	return row
}

func record(t *testing.T, db *DB, a Attempt, out Outcome) int64 {
	t.Helper()
	id, err := db.RecordAttempt(context.Background(), a, out)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func claimIDs(t *testing.T, db *DB, target string, now time.Time, limit int, lease time.Duration) []int64 {
	t.Helper()
	rows, err := db.ClaimDue(context.Background(), target, now, limit, lease)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	return ids
}

func rowIDs(rows []OutboxRow) []int64 {
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	return ids
}

func sameIDs(a, b []int64) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}

func TestClaimDueLeases(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	// Queued in reverse of their due order: the claim orders by due time.
	c := enqueue(t, db, "crm", "evt_c", "payment.succeeded", t0.Add(2*time.Second))
	b := enqueue(t, db, "crm", "evt_b", "payment.succeeded", t0.Add(time.Second))
	a := enqueue(t, db, "crm", "evt_a", "payment.succeeded", t0)
	other := enqueue(t, db, "billing", "evt_a", "payment.succeeded", t0)
	notYet := enqueue(t, db, "crm", "evt_later", "payment.succeeded", t0.Add(time.Hour))

	now := t0.Add(5 * time.Second)
	const lease = 30 * time.Second
	rows, err := db.ClaimDue(ctx, "crm", now, 2, lease)
	if err != nil {
		t.Fatal(err)
	}
	if got := rowIDs(rows); !sameIDs(got, []int64{a, b}) {
		t.Fatalf("first claim = %v, want [%d %d]", got, a, b)
	}
	// The rows show their values before the claim.
	if !rows[0].NextAttemptAt.Equal(t0) || rows[0].EventID != "evt_a" || rows[0].Status != StatusPending {
		t.Errorf("claimed row = %+v, want evt_a pending due at %v", rows[0], t0)
	}
	// The claim leaves the row in its place in the queue, and says until
	// when it holds it.
	if got := mustDelivery(t, db, a); !got.NextAttemptAt.Equal(t0) || !got.ClaimedUntil.Equal(now.Add(lease)) {
		t.Errorf("leased row due at %v, claimed until %v; want %v and %v", got.NextAttemptAt, got.ClaimedUntil, t0, now.Add(lease))
	}
	if got := claimIDs(t, db, "crm", now, 10, lease); !sameIDs(got, []int64{c}) {
		t.Errorf("second claim = %v, want only the unclaimed [%d]", got, c)
	}
	if got := claimIDs(t, db, "crm", now.Add(lease-time.Nanosecond), 10, lease); len(got) != 0 {
		t.Errorf("claim before the lease ends = %v, want none", got)
	}
	// The leases ended (the process died mid-attempt, say): due again,
	// each in its own place in the queue.
	if got := claimIDs(t, db, "crm", now.Add(lease), 10, lease); !sameIDs(got, []int64{a, b, c}) {
		t.Errorf("claim after the lease = %v, want [%d %d %d]", got, a, b, c)
	}
	if got := claimIDs(t, db, "billing", now, 10, lease); !sameIDs(got, []int64{other}) {
		t.Errorf("billing claim = %v, want [%d]: one target's claims leave another's rows alone", got, other)
	}
	if got := claimIDs(t, db, "crm", t0.Add(time.Hour), 10, lease); !sameIDs(got, []int64{a, b, c, notYet}) {
		t.Errorf("claim an hour later = %v, want [%d %d %d %d]", got, a, b, c, notYet)
	}
	if _, err := db.ClaimDue(ctx, "crm", now, 0, lease); err == nil {
		t.Error("ClaimDue with limit 0 did not fail")
	}
}

func TestRecordAttemptTransitions(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	id := enqueue(t, db, "crm", "evt_1", "payment.succeeded", t0)
	const url = "https://crm.example/hook"

	// 503: retrying at the next time of the schedule.
	first := Attempt{DeliveryID: id, Target: "crm", URL: url, Attempt: 1, StatusCode: 503,
		Body: "busy", RequestID: "req_1", Duration: 1500 * time.Microsecond, At: t0.Add(time.Second)}
	record(t, db, first, Outcome{Status: StatusRetrying, NextAttemptAt: t0.Add(time.Minute)})
	row := mustDelivery(t, db, id)
	if row.Status != StatusRetrying || row.Attempts != 1 || !row.NextAttemptAt.Equal(t0.Add(time.Minute)) ||
		row.LastStatus != 503 || row.LastError != "busy" || !row.UpdatedAt.Equal(first.At) {
		t.Errorf("after a 503: %+v; want retrying, 1 attempt, due %v, last 503 busy", row, t0.Add(time.Minute))
	}
	if got := claimIDs(t, db, "crm", t0.Add(59*time.Second), 10, time.Minute); len(got) != 0 {
		t.Errorf("claimed %v before the retry is due", got)
	}
	if got := claimIDs(t, db, "crm", t0.Add(time.Minute), 10, time.Minute); !sameIDs(got, []int64{id}) {
		t.Errorf("claim at the retry time = %v, want [%d]", got, id)
	}

	// No answer: the error is the last error, the status 0.
	record(t, db, Attempt{DeliveryID: id, Target: "crm", URL: url, Attempt: 2, Error: "connection refused",
		RequestID: "req_2", At: t0.Add(time.Minute)}, Outcome{Status: StatusRetrying, NextAttemptAt: t0.Add(11 * time.Minute)})
	row = mustDelivery(t, db, id)
	if row.Status != StatusRetrying || row.Attempts != 2 || row.LastStatus != 0 || row.LastError != "connection refused" {
		t.Errorf("after a refused connection: %+v", row)
	}

	// 200: delivered, never due again.
	record(t, db, Attempt{DeliveryID: id, Target: "crm", URL: url, Attempt: 3, StatusCode: 200,
		RequestID: "req_3", At: t0.Add(11 * time.Minute)}, Outcome{Status: StatusDelivered})
	row = mustDelivery(t, db, id)
	if row.Status != StatusDelivered || row.Attempts != 3 || !row.NextAttemptAt.IsZero() || row.LastStatus != 200 || row.LastError != "" {
		t.Errorf("after a 200: %+v; want delivered, 3 attempts, no next attempt", row)
	}
	if got := claimIDs(t, db, "crm", t0.Add(48*time.Hour), 10, time.Minute); len(got) != 0 {
		t.Errorf("a delivered row was claimed: %v", got)
	}

	atts, err := db.Attempts(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(atts) != 3 {
		t.Fatalf("Attempts = %d rows, want 3", len(atts))
	}
	want := first
	want.ID = atts[0].ID
	if atts[0] != want {
		t.Errorf("first attempt read back as\n%+v\nwant\n%+v", atts[0], want)
	}
	for i, a := range atts {
		if a.Attempt != i+1 || a.RequestID != fmt.Sprintf("req_%d", i+1) {
			t.Errorf("attempt %d = %+v, out of order", i, a)
		}
	}

	// 400 with a long body: dead at once; body and last error cut to 4 KiB.
	dead := enqueue(t, db, "crm", "evt_2", "payment.succeeded", t0)
	long := strings.Repeat("x", MaxAttemptBody-1) + "é" + strings.Repeat("y", 100)
	record(t, db, Attempt{DeliveryID: dead, Target: "crm", URL: url, Attempt: 1, StatusCode: 400,
		Body: long, At: t0.Add(time.Second)}, Outcome{Status: StatusDeadLetter})
	row = mustDelivery(t, db, dead)
	if row.Status != StatusDeadLetter || row.Attempts != 1 || row.LastStatus != 400 {
		t.Errorf("after a 400: %+v; want dead_letter after 1 attempt", row)
	}
	if want := strings.Repeat("x", MaxAttemptBody-1); row.LastError != want {
		t.Errorf("last error has %d bytes, want the body cut before the split character (%d)", len(row.LastError), len(want))
	}
	atts, err = db.Attempts(ctx, dead)
	if err != nil || len(atts) != 1 || len(atts[0].Body) != MaxAttemptBody-1 {
		t.Errorf("Attempts(dead) = %d rows, %v; want 1 with a cut body", len(atts), err)
	}

	// A redirect is logged, the dead letter left exactly as it was but for
	// its attempt count, which moves past the redirect's number.
	before := mustDelivery(t, db, dead)
	record(t, db, Attempt{DeliveryID: dead, Target: "crm", URL: "https://inspector.example/x", Attempt: 2,
		StatusCode: 200, Redirect: true, At: t0.Add(time.Hour)}, Outcome{})
	before.Attempts = 2
	if after := mustDelivery(t, db, dead); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("redirect changed the delivery:\n%+v\nwant\n%+v", after, before)
	}
	atts, err = db.Attempts(ctx, dead)
	if err != nil || len(atts) != 2 || !atts[1].Redirect || atts[1].URL != "https://inspector.example/x" || atts[1].Attempt != 2 {
		t.Errorf("Attempts after redirect = %+v, %v", atts, err)
	}

	// Errors.
	for name, c := range map[string]struct {
		a   Attempt
		out Outcome
	}{
		"unknown delivery":          {Attempt{DeliveryID: 999, Attempt: 1}, Outcome{Status: StatusDelivered}},
		"redirect unknown delivery": {Attempt{DeliveryID: 999, Attempt: 1, Redirect: true}, Outcome{}},
	} {
		if _, err := db.RecordAttempt(ctx, c.a, c.out); !errors.Is(err, backstop.ErrNotFound) {
			t.Errorf("%s: err = %v, want ErrNotFound", name, err)
		}
	}
	for name, c := range map[string]struct {
		a   Attempt
		out Outcome
	}{
		"bad status":            {Attempt{DeliveryID: id, Attempt: 4}, Outcome{Status: "lost"}},
		"pending is no outcome": {Attempt{DeliveryID: id, Attempt: 4}, Outcome{Status: StatusPending}},
		"retrying without time": {Attempt{DeliveryID: id, Attempt: 4}, Outcome{Status: StatusRetrying}},
		"attempt 0":             {Attempt{DeliveryID: id}, Outcome{Status: StatusDelivered}},
	} {
		if _, err := db.RecordAttempt(ctx, c.a, c.out); err == nil {
			t.Errorf("%s: RecordAttempt did not fail", name)
		}
	}
	if atts, _ := db.Attempts(ctx, id); len(atts) != 3 {
		t.Errorf("failed RecordAttempt calls logged attempts: %d rows, want 3", len(atts))
	}
}

func TestDeliveries(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	a := enqueue(t, db, "crm", "evt_a", "payment.succeeded", t0)
	b := enqueue(t, db, "crm", "evt_b", "contact.created", t0.Add(time.Hour))
	c := enqueue(t, db, "billing", "evt_a", "payment.succeeded", t0.Add(2*time.Hour))
	d := enqueue(t, db, "billing", "evt_d", "payment.failed", t0.Add(3*time.Hour))
	record(t, db, Attempt{DeliveryID: b, Target: "crm", Attempt: 1, StatusCode: 404, At: t0.Add(time.Hour)},
		Outcome{Status: StatusDeadLetter})
	record(t, db, Attempt{DeliveryID: c, Target: "billing", Attempt: 1, StatusCode: 200, At: t0.Add(2 * time.Hour)},
		Outcome{Status: StatusDelivered})

	for _, c := range []struct {
		name string
		f    DeliveryFilter
		want []int64
	}{
		{"all, newest first", DeliveryFilter{}, []int64{d, c, b, a}},
		{"status", DeliveryFilter{Status: StatusPending}, []int64{d, a}},
		{"dead", DeliveryFilter{Status: StatusDeadLetter}, []int64{b}},
		{"target", DeliveryFilter{Target: "crm"}, []int64{b, a}},
		{"event type", DeliveryFilter{EventType: "payment.succeeded"}, []int64{c, a}},
		{"event type glob", DeliveryFilter{EventType: "payment.*"}, []int64{d, c, a}},
		{"event type glob with a class", DeliveryFilter{EventType: "payment.[fx]ailed"}, []int64{d}},
		{"event type glob and target", DeliveryFilter{EventType: "*.created", Target: "crm"}, []int64{b}},
		{"since is inclusive", DeliveryFilter{Since: t0.Add(time.Hour)}, []int64{d, c, b}},
		{"combined", DeliveryFilter{Target: "billing", Status: StatusPending, Since: t0}, []int64{d}},
		{"limit", DeliveryFilter{Limit: 2}, []int64{d, c}},
		{"offset", DeliveryFilter{Limit: 2, Offset: 2}, []int64{b, a}},
		{"nothing", DeliveryFilter{Target: "nobody"}, []int64{}},
	} {
		rows, err := db.Deliveries(ctx, c.f)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got := rowIDs(rows); !sameIDs(got, c.want) {
			t.Errorf("%s: Deliveries = %v, want %v", c.name, got, c.want)
		}
	}
	if _, err := db.Deliveries(ctx, DeliveryFilter{Status: "lost"}); err == nil {
		t.Error("Deliveries with an unknown status did not fail")
	}
	if _, err := db.Deliveries(ctx, DeliveryFilter{EventType: "payment.[x"}); err == nil || !strings.Contains(err.Error(), `event type pattern "payment.[x"`) {
		t.Errorf("Deliveries with a malformed glob: %v, want it refused naming the pattern", err)
	}

	row := mustDelivery(t, db, b)
	if row.Target != "crm" || row.EventID != "evt_b" || row.EventType != "contact.created" ||
		row.Status != StatusDeadLetter || row.LastStatus != 404 || !row.CreatedAt.Equal(t0.Add(time.Hour)) {
		t.Errorf("Delivery(%d) = %+v", b, row)
	}
	if _, ok, err := db.Delivery(ctx, 999); ok || err != nil {
		t.Errorf("Delivery(999) = %v, %v; want not found", ok, err)
	}
}

func TestRetryDeliveryAndRetryDead(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	deadCRM1 := enqueue(t, db, "crm", "evt_1", "payment.succeeded", t0)
	deadCRM2 := enqueue(t, db, "crm", "evt_2", "payment.succeeded", t0)
	deadBilling := enqueue(t, db, "billing", "evt_1", "payment.succeeded", t0)
	delivered := enqueue(t, db, "crm", "evt_3", "payment.succeeded", t0)
	for _, id := range []int64{deadCRM1, deadCRM2, deadBilling} {
		record(t, db, Attempt{DeliveryID: id, Attempt: 5, StatusCode: 500, Body: "oops", At: t0.Add(time.Hour)},
			Outcome{Status: StatusDeadLetter, Failures: 5})
		if row := mustDelivery(t, db, id); row.Failures != 5 {
			t.Fatalf("dead letter %d: %d failures recorded, want 5", id, row.Failures)
		}
	}
	record(t, db, Attempt{DeliveryID: delivered, Attempt: 3, StatusCode: 204, At: t0.Add(time.Minute)},
		Outcome{Status: StatusDelivered, Failures: 2})

	now := t0.Add(24 * time.Hour)
	n, err := db.RetryDead(ctx, "crm", now)
	if err != nil || n != 2 {
		t.Fatalf("RetryDead(crm) = %d, %v; want 2", n, err)
	}
	for _, id := range []int64{deadCRM1, deadCRM2} {
		row := mustDelivery(t, db, id)
		if row.Status != StatusPending || row.Attempts != 5 || row.Failures != 0 || !row.NextAttemptAt.Equal(now) ||
			row.LastStatus != 500 || row.LastError != "oops" || !row.UpdatedAt.Equal(now) {
			t.Errorf("retried dead letter %d = %+v; want pending, 0 failures, its 5 attempts still counted, due %v, last 500 oops kept", id, row, now)
		}
	}
	if row := mustDelivery(t, db, deadBilling); row.Status != StatusDeadLetter {
		t.Errorf("billing's dead letter became %s; RetryDead(crm) must leave other targets alone", row.Status)
	}
	if got := claimIDs(t, db, "crm", now, 10, time.Minute); !sameIDs(got, []int64{deadCRM1, deadCRM2}) {
		t.Errorf("claim after RetryDead = %v, want [%d %d]", got, deadCRM1, deadCRM2)
	}
	if n, err := db.RetryDead(ctx, "crm", now); err != nil || n != 0 {
		t.Errorf("second RetryDead(crm) = %d, %v; want 0", n, err)
	}

	// Any status can be retried by id.
	if err := db.RetryDelivery(ctx, delivered, now); err != nil {
		t.Fatal(err)
	}
	if row := mustDelivery(t, db, delivered); row.Status != StatusPending || row.Attempts != 3 || row.Failures != 0 ||
		!row.NextAttemptAt.Equal(now) || row.LastStatus != 204 {
		t.Errorf("retried delivered row = %+v", row)
	}
	if err := db.RetryDelivery(ctx, 999, now); !errors.Is(err, backstop.ErrNotFound) {
		t.Errorf("RetryDelivery(999) = %v, want ErrNotFound", err)
	}
	if _, err := db.RetryDead(ctx, "", now); err == nil {
		t.Error("RetryDead with an empty target did not fail")
	}
}

func TestPurgeDeadAndPruneAttemptsAndDelivered(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	oldDead := enqueue(t, db, "crm", "evt_1", "payment.succeeded", t0)
	newDead := enqueue(t, db, "crm", "evt_2", "payment.succeeded", t0)
	oldDelivered := enqueue(t, db, "crm", "evt_3", "payment.succeeded", t0)
	record(t, db, Attempt{DeliveryID: oldDead, Attempt: 1, StatusCode: 500, At: t0},
		Outcome{Status: StatusRetrying, NextAttemptAt: t0.Add(time.Minute)})
	record(t, db, Attempt{DeliveryID: oldDead, Attempt: 2, StatusCode: 400, At: t0.Add(time.Minute)},
		Outcome{Status: StatusDeadLetter})
	record(t, db, Attempt{DeliveryID: newDead, Attempt: 1, StatusCode: 400, At: t0.Add(2 * time.Hour)},
		Outcome{Status: StatusDeadLetter})
	record(t, db, Attempt{DeliveryID: oldDelivered, Attempt: 1, StatusCode: 200, At: t0},
		Outcome{Status: StatusDelivered})

	n, err := db.PurgeDead(ctx, t0.Add(time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("PurgeDead = %d, %v; want 1", n, err)
	}
	if _, ok, err := db.Delivery(ctx, oldDead); err != nil {
		t.Fatal(err)
	} else if ok {
		t.Error("the old dead letter was kept")
	}
	if atts, err := db.Attempts(ctx, oldDead); err != nil || len(atts) != 0 {
		t.Errorf("the purged dead letter kept %d attempts (%v)", len(atts), err)
	}
	mustDelivery(t, db, newDead)
	mustDelivery(t, db, oldDelivered)

	// Attempts are pruned by age whatever their delivery's status; the
	// deliveries stay.
	n, err = db.PruneAttempts(ctx, t0.Add(time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("PruneAttempts = %d, %v; want 1 (the delivered row's)", n, err)
	}
	if atts, err := db.Attempts(ctx, oldDelivered); err != nil {
		t.Fatal(err)
	} else if len(atts) != 0 {
		t.Errorf("old attempt kept: %+v", atts)
	}
	if atts, _ := db.Attempts(ctx, newDead); len(atts) != 1 {
		t.Errorf("new attempt pruned: %+v", atts)
	}
	mustDelivery(t, db, oldDelivered)
	if n, err := db.PruneAttempts(ctx, t0.Add(time.Hour)); err != nil || n != 0 {
		t.Errorf("second PruneAttempts = %d, %v; want 0", n, err)
	}

	// Delivered rows are pruned by when they were delivered, with their
	// attempts; queued rows and dead letters stay, however old.
	newDelivered := enqueue(t, db, "crm", "evt_4", "payment.succeeded", t0)
	record(t, db, Attempt{DeliveryID: newDelivered, Attempt: 1, StatusCode: 200, At: t0.Add(2 * time.Hour)},
		Outcome{Status: StatusDelivered})
	queued := enqueue(t, db, "crm", "evt_5", "payment.succeeded", t0)
	oldDead2 := enqueue(t, db, "crm", "evt_6", "payment.succeeded", t0)
	record(t, db, Attempt{DeliveryID: oldDead2, Attempt: 1, StatusCode: 400, At: t0}, Outcome{Status: StatusDeadLetter})
	oldDelivered2 := enqueue(t, db, "crm", "evt_7", "payment.succeeded", t0)
	record(t, db, Attempt{DeliveryID: oldDelivered2, Attempt: 1, StatusCode: 200, At: t0}, Outcome{Status: StatusDelivered})
	if atts, _ := db.Attempts(ctx, oldDelivered2); len(atts) != 1 {
		t.Fatalf("set-up: %d attempts", len(atts))
	}
	n, err = db.PruneDelivered(ctx, t0.Add(time.Hour))
	if err != nil || n != 2 {
		t.Fatalf("PruneDelivered = %d, %v; want 2 (the old delivered rows)", n, err)
	}
	for _, id := range []int64{oldDelivered, oldDelivered2} {
		if _, ok, err := db.Delivery(ctx, id); err != nil {
			t.Fatal(err)
		} else if ok {
			t.Errorf("old delivered row %d was kept", id)
		}
	}
	if atts, err := db.Attempts(ctx, oldDelivered2); err != nil {
		t.Fatal(err)
	} else if len(atts) != 0 {
		t.Errorf("the pruned delivery kept %d attempts", len(atts))
	}
	mustDelivery(t, db, newDelivered)
	mustDelivery(t, db, newDead)
	mustDelivery(t, db, oldDead2)
	mustDelivery(t, db, queued)
	if atts, _ := db.Attempts(ctx, newDelivered); len(atts) != 1 {
		t.Errorf("the new delivered row lost its attempt: %+v", atts)
	}
}

func TestEnqueue(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	payload := json.RawMessage(`{"any":["json",1]}`)
	id, err := db.Enqueue(ctx, "crm", "evt_1", "order.created", payload, t0)
	if err != nil {
		t.Fatal(err)
	}
	row := mustDelivery(t, db, id)
	if row.Target != "crm" || row.EventID != "evt_1" || row.EventType != "order.created" || string(row.Payload) != string(payload) ||
		row.Status != StatusPending || row.Attempts != 0 || !row.NextAttemptAt.Equal(t0) || !row.CreatedAt.Equal(t0) {
		t.Errorf("enqueued row = %+v", row)
	}
	// A repeat (re-encoded: whitespace aside) gets the first id; one with
	// another payload or event type is refused, naming the first.
	again, err := db.Enqueue(ctx, "crm", "evt_1", "order.created", json.RawMessage(`{ "any": [ "json", 1 ] }`), t0.Add(time.Hour))
	if err != nil || again != id {
		t.Errorf("repeated Enqueue = %d, %v; want the first id %d", again, err, id)
	}
	for _, c := range []struct {
		typ     string
		payload json.RawMessage
	}{{"order.created", json.RawMessage(`{"other":true}`)}, {"order.paid", payload}} {
		_, err := db.Enqueue(ctx, "crm", "evt_1", c.typ, c.payload, t0.Add(time.Hour))
		var reused *backstop.KeyReusedError
		if !errors.As(err, &reused) || reused.ID != id || reused.Key != "evt_1" {
			t.Errorf("Enqueue of evt_1 again as %s %s: %v; want a KeyReusedError naming delivery %d", c.typ, c.payload, err, id)
		}
	}
	if row := mustDelivery(t, db, id); string(row.Payload) != string(payload) || !row.CreatedAt.Equal(t0) {
		t.Errorf("a repeated Enqueue changed the row: %+v", row)
	}
	// A retry re-encoded with its keys in another order, or a character
	// escaped, is the same JSON; an array in another order is not.
	first, err := db.Enqueue(ctx, "crm", "evt_2", "order.created", json.RawMessage(`{"a":"é","b":[1,2]}`), t0)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := db.Enqueue(ctx, "crm", "evt_2", "order.created", json.RawMessage(`{"b":[1,2],"a":"\u00e9"}`), t0); err != nil || again != first {
		t.Errorf("Enqueue of evt_2 re-encoded = %d, %v; want the first id %d", again, err, first)
	}
	if _, err := db.Enqueue(ctx, "crm", "evt_2", "order.created", json.RawMessage(`{"a":"é","b":[2,1]}`), t0); !errors.As(err, new(*backstop.KeyReusedError)) {
		t.Errorf("Enqueue of evt_2 with its array reordered: %v; want a KeyReusedError", err)
	}
	other, err := db.Enqueue(ctx, "billing", "evt_1", "order.created", payload, t0)
	if err != nil || other == id {
		t.Errorf("Enqueue for another target = %d, %v; want a new row", other, err)
	}
	for name, p := range map[string]json.RawMessage{"invalid": json.RawMessage(`{"a":`), "empty": nil} {
		if _, err := db.Enqueue(ctx, "crm", "evt_x", "x", p, t0); err == nil {
			t.Errorf("Enqueue of %s JSON did not fail", name)
		}
	}
	if rows := outboxRows(t, db, ""); len(rows) != 3 {
		t.Errorf("outbox has %d rows, want 3 (evt_1 for crm and billing, evt_2 for crm)", len(rows))
	}
}

func TestTargetStates(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	enqueue(t, db, "crm", "evt_1", "payment.succeeded", t0)
	r := enqueue(t, db, "crm", "evt_2", "payment.succeeded", t0)
	dl := enqueue(t, db, "crm", "evt_3", "payment.succeeded", t0)
	dv := enqueue(t, db, "crm", "evt_4", "payment.succeeded", t0)
	enqueue(t, db, "crm", "evt_5", "payment.succeeded", t0)
	enqueue(t, db, "billing", "evt_1", "payment.succeeded", t0)
	record(t, db, Attempt{DeliveryID: r, Attempt: 1, StatusCode: 503, At: t0}, Outcome{Status: StatusRetrying, NextAttemptAt: t0.Add(time.Minute)})
	record(t, db, Attempt{DeliveryID: dl, Attempt: 1, StatusCode: 404, At: t0}, Outcome{Status: StatusDeadLetter})
	record(t, db, Attempt{DeliveryID: dv, Attempt: 1, StatusCode: 200, At: t0}, Outcome{Status: StatusDelivered})

	states := func(names ...string) []TargetState {
		t.Helper()
		got, err := db.TargetStates(ctx, names)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(names) {
			t.Fatalf("TargetStates(%v) = %d states", names, len(got))
		}
		return got
	}
	got := states("crm", "nobody", "billing", "crm")
	want := []TargetState{
		{Name: "crm", Pending: 2, Retrying: 1, DeadLetter: 1, Delivered: 1},
		{Name: "nobody"},
		{Name: "billing", Pending: 1},
		{Name: "crm", Pending: 2, Retrying: 1, DeadLetter: 1, Delivered: 1},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("state %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if got, err := db.TargetStates(ctx, nil); err != nil || len(got) != 0 {
		t.Errorf("TargetStates(nil) = %v, %v", got, err)
	}

	// A pause only ever grows.
	for _, c := range []struct {
		until, want time.Time
	}{
		{t0.Add(10 * time.Second), t0.Add(10 * time.Second)},
		{t0.Add(5 * time.Second), t0.Add(10 * time.Second)},
		{t0.Add(20 * time.Second), t0.Add(20 * time.Second)},
	} {
		if err := db.PauseTarget(ctx, "crm", c.until); err != nil {
			t.Fatal(err)
		}
		if got := states("crm")[0].PausedUntil; !got.Equal(c.want) {
			t.Errorf("after PauseTarget(%v): paused until %v, want %v", c.until, got, c.want)
		}
	}
	if got := states("billing")[0].PausedUntil; !got.IsZero() {
		t.Errorf("billing paused until %v, want not paused", got)
	}

	// Disabled until enabled; enabling also ends the pause.
	if err := db.DisableTarget(ctx, "crm", "410 Gone", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	s := states("crm")[0]
	if !s.Disabled || s.DisabledReason != "410 Gone" || !s.DisabledAt.Equal(t0.Add(time.Minute)) || !s.PausedUntil.Equal(t0.Add(20*time.Second)) {
		t.Errorf("disabled state = %+v", s)
	}
	if err := db.DisableTarget(ctx, "billing", "410 Gone", t0); err != nil {
		t.Fatal(err)
	}
	if err := db.EnableTarget(ctx, "crm"); err != nil {
		t.Fatal(err)
	}
	s = states("crm")[0]
	if s.Disabled || s.DisabledReason != "" || !s.DisabledAt.IsZero() || !s.PausedUntil.IsZero() || s.Pending != 2 {
		t.Errorf("enabled state = %+v; want neither disabled nor paused", s)
	}
	if !states("billing")[0].Disabled {
		t.Error("enabling crm enabled billing")
	}
	if err := db.EnableTarget(ctx, "nobody"); err != nil {
		t.Errorf("EnableTarget of an unknown target = %v", err)
	}
}

// TestDeliveryAfterClose: the delivery methods fail, not panic, on a closed
// store, also once their statements are prepared.
func TestDeliveryAfterClose(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	id := enqueue(t, db, "crm", "evt_1", "x", t0)
	claimIDs(t, db, "crm", t0, 1, time.Minute)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ClaimDue(ctx, "crm", t0.Add(time.Hour), 1, time.Minute); err == nil {
		t.Error("ClaimDue after Close did not fail")
	}
	if _, err := db.RecordAttempt(ctx, Attempt{DeliveryID: id, Attempt: 1}, Outcome{Status: StatusDelivered}); err == nil {
		t.Error("RecordAttempt after Close did not fail")
	}
}

func TestRecordAttempts(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	a := enqueue(t, db, "crm", "evt_a", "contact.created", t0)
	b := enqueue(t, db, "crm", "evt_b", "contact.created", t0)
	c := enqueue(t, db, "billing", "evt_a", "contact.created", t0)

	if ids, err := db.RecordAttempts(ctx, nil); err != nil || len(ids) != 0 {
		t.Errorf("RecordAttempts(nil) = %v, %v; want no ids", ids, err)
	}

	// One transaction for many: each item as RecordAttempt would record it,
	// in order (b twice: its second outcome wins).
	ids, err := db.RecordAttempts(ctx, []AttemptOutcome{
		{Attempt{DeliveryID: a, Target: "crm", Attempt: 1, StatusCode: 200, At: t0}, Outcome{Status: StatusDelivered}},
		{Attempt{DeliveryID: b, Target: "crm", Attempt: 1, StatusCode: 500, Body: "oops", At: t0},
			Outcome{Status: StatusRetrying, NextAttemptAt: t0.Add(time.Minute)}},
		{Attempt{DeliveryID: b, Target: "crm", Attempt: 2, StatusCode: 404, At: t0.Add(time.Minute)}, Outcome{Status: StatusDeadLetter}},
		{Attempt{DeliveryID: c, Target: "billing", URL: "https://inspector.example/x", Attempt: 1, StatusCode: 200,
			Redirect: true, At: t0}, Outcome{}},
	})
	if err != nil || len(ids) != 4 {
		t.Fatalf("RecordAttempts = %v, %v; want 4 ids", ids, err)
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			t.Errorf("ids %v not in recording order", ids)
		}
	}
	if r := mustDelivery(t, db, a); r.Status != StatusDelivered || r.Attempts != 1 || r.LastStatus != 200 {
		t.Errorf("delivery a = %+v", r)
	}
	if r := mustDelivery(t, db, b); r.Status != StatusDeadLetter || r.Attempts != 2 || r.LastStatus != 404 {
		t.Errorf("delivery b = %+v", r)
	}
	if r := mustDelivery(t, db, c); r.Status != StatusPending || r.Attempts != 1 || r.LastStatus != 0 || !r.NextAttemptAt.Equal(t0) {
		t.Errorf("redirect changed delivery c beyond its attempt count: %+v", r)
	}
	if atts, err := db.Attempts(ctx, b); err != nil || len(atts) != 2 || atts[0].ID != ids[1] || atts[0].Body != "oops" {
		t.Errorf("Attempts(b) = %+v, %v", atts, err)
	}

	// All or nothing: one bad item records none of the others, and the
	// error names it.
	d := enqueue(t, db, "crm", "evt_d", "contact.created", t0)
	good := AttemptOutcome{Attempt{DeliveryID: d, Target: "crm", Attempt: 1, StatusCode: 200, At: t0}, Outcome{Status: StatusDelivered}}
	for name, bad := range map[string]AttemptOutcome{
		"unknown delivery": {Attempt{DeliveryID: 999, Attempt: 1}, Outcome{Status: StatusDelivered}},
		"bad status":       {Attempt{DeliveryID: a, Attempt: 2}, Outcome{Status: "lost"}},
	} {
		_, err := db.RecordAttempts(ctx, []AttemptOutcome{good, bad})
		if err == nil {
			t.Fatalf("%s: RecordAttempts did not fail", name)
		}
		if !strings.Contains(err.Error(), "item 2") {
			t.Errorf("%s: error %q does not name item 2", name, err)
		}
		if name == "unknown delivery" && !errors.Is(err, backstop.ErrNotFound) {
			t.Errorf("%s: err = %v, want ErrNotFound", name, err)
		}
	}
	if r := mustDelivery(t, db, d); r.Status != StatusPending || r.Attempts != 0 {
		t.Errorf("a failed RecordAttempts changed delivery d: %+v", r)
	}
	if atts, err := db.Attempts(ctx, d); err != nil {
		t.Fatal(err)
	} else if len(atts) != 0 {
		t.Errorf("a failed RecordAttempts logged %d attempts of d", len(atts))
	}
}

// TestTargetQueue: the worker's view of a target is TargetStates' without
// the delivered and dead-letter counts, from one statement, and without
// the queued counts either when it does not ask for them.
func TestTargetQueue(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	enqueue(t, db, "crm", "evt_1", "payment.succeeded", t0)
	r := enqueue(t, db, "crm", "evt_2", "payment.succeeded", t0)
	dl := enqueue(t, db, "crm", "evt_3", "payment.succeeded", t0)
	dv := enqueue(t, db, "crm", "evt_4", "payment.succeeded", t0)
	enqueue(t, db, "billing", "evt_1", "payment.succeeded", t0)
	record(t, db, Attempt{DeliveryID: r, Attempt: 1, StatusCode: 503, At: t0}, Outcome{Status: StatusRetrying, NextAttemptAt: t0.Add(time.Minute)})
	record(t, db, Attempt{DeliveryID: dl, Attempt: 1, StatusCode: 404, At: t0}, Outcome{Status: StatusDeadLetter})
	record(t, db, Attempt{DeliveryID: dv, Attempt: 1, StatusCode: 200, At: t0}, Outcome{Status: StatusDelivered})

	queue := func(name string) TargetState {
		t.Helper()
		st, err := db.TargetQueue(ctx, name, true)
		if err != nil {
			t.Fatal(err)
		}
		stateOnly, err := db.TargetQueue(ctx, name, false)
		if err != nil {
			t.Fatal(err)
		}
		want := st
		want.Pending, want.Retrying = 0, 0
		if stateOnly != want {
			t.Errorf("TargetQueue(%s) without counts = %+v, want %+v", name, stateOnly, want)
		}
		return st
	}
	if got, want := queue("crm"), (TargetState{Name: "crm", Pending: 1, Retrying: 1}); got != want {
		t.Errorf("TargetQueue(crm) = %+v, want %+v", got, want)
	}
	if got, want := queue("nobody"), (TargetState{Name: "nobody"}); got != want {
		t.Errorf("TargetQueue(nobody) = %+v, want %+v", got, want)
	}
	if err := db.PauseTarget(ctx, "crm", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := db.DisableTarget(ctx, "crm", "410 Gone", t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	full, err := db.TargetStates(ctx, []string{"crm"})
	if err != nil {
		t.Fatal(err)
	}
	want := full[0]
	want.Delivered, want.DeadLetter = 0, 0
	if got := queue("crm"); got != want || !got.Disabled || got.PausedUntil.IsZero() {
		t.Errorf("TargetQueue(crm) = %+v, want %+v", got, want)
	}
	if got, want := queue("billing"), (TargetState{Name: "billing", Pending: 1}); got != want {
		t.Errorf("TargetQueue(billing) = %+v, want %+v", got, want)
	}
}

// TestRelease: rows claimed but not sent are due again at once; rows that
// were attempted meanwhile keep their outcome.
func TestRelease(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	a := enqueue(t, db, "crm", "evt_a", "payment.succeeded", t0)
	b := enqueue(t, db, "crm", "evt_b", "payment.succeeded", t0)
	c := enqueue(t, db, "crm", "evt_c", "payment.succeeded", t0)
	if got := claimIDs(t, db, "crm", t0, 10, time.Hour); !sameIDs(got, []int64{a, b, c}) {
		t.Fatalf("claim = %v", got)
	}
	record(t, db, Attempt{DeliveryID: a, Attempt: 1, StatusCode: 200, At: t0}, Outcome{Status: StatusDelivered})
	n, err := db.Release(ctx, []int64{a, b, c}, make([]time.Time, 3), t0.Add(time.Hour), t0.Add(time.Second))
	if err != nil || n != 2 {
		t.Fatalf("Release = %d, %v; want 2 (b and c)", n, err)
	}
	if got := claimIDs(t, db, "crm", t0.Add(time.Second), 10, time.Hour); !sameIDs(got, []int64{b, c}) {
		t.Errorf("claim after release = %v, want [%d %d]", got, b, c)
	}
	if r := mustDelivery(t, db, a); r.Status != StatusDelivered {
		t.Errorf("released a delivered row: %+v", r)
	}
	if n, err := db.Release(ctx, nil, nil, t0, t0); err != nil || n != 0 {
		t.Errorf("Release(nil) = %d, %v", n, err)
	}
}

// TestReleaseKeepsTheirPlace: released rows are due again at the time each
// was due when claimed, so they are claimed again before the rows queued
// while they were held, in their own order.
func TestReleaseKeepsTheirPlace(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	a := enqueue(t, db, "crm", "evt_a", "payment.succeeded", t0)
	b := enqueue(t, db, "crm", "evt_b", "payment.succeeded", t0.Add(time.Second))
	claimed, err := db.ClaimDue(ctx, "crm", t0.Add(2*time.Second), 10, time.Hour)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim = %v, %v", claimed, err)
	}
	c := enqueue(t, db, "crm", "evt_c", "payment.succeeded", t0.Add(3*time.Second))
	lease := t0.Add(2*time.Second + time.Hour)
	n, err := db.Release(ctx, []int64{claimed[0].ID, claimed[1].ID},
		[]time.Time{claimed[0].NextAttemptAt, claimed[1].NextAttemptAt}, lease, t0.Add(4*time.Second))
	if err != nil || n != 2 {
		t.Fatalf("Release = %d, %v; want 2", n, err)
	}
	if got := claimIDs(t, db, "crm", t0.Add(5*time.Second), 10, time.Hour); !slices.Equal(got, []int64{a, b, c}) {
		t.Errorf("claim after release = %v, want [%d %d %d]", got, a, b, c)
	}
}

// TestReleaseLeavesAnotherClaimsRows: a release by a claim whose lease ran
// out does not release the rows another claim took since (they are in
// flight there), nor rows a manual retry re-queued.
func TestReleaseLeavesAnotherClaimsRows(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	a := enqueue(t, db, "crm", "evt_a", "payment.succeeded", t0)
	b := enqueue(t, db, "crm", "evt_b", "payment.succeeded", t0)
	first := t0.Add(time.Minute) // the first claim's lease end
	if got := claimIDs(t, db, "crm", t0, 10, time.Minute); !sameIDs(got, []int64{a, b}) {
		t.Fatalf("first claim = %v", got)
	}
	// The lease runs out; another process claims a; b is retried by hand.
	if got := claimIDs(t, db, "crm", first, 1, time.Minute); !sameIDs(got, []int64{a}) {
		t.Fatalf("second claim = %v", got)
	}
	if err := db.RetryDelivery(ctx, b, first.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	before := []OutboxRow{mustDelivery(t, db, a), mustDelivery(t, db, b)}
	n, err := db.Release(ctx, []int64{a, b}, make([]time.Time, 2), first, first.Add(2*time.Second))
	if err != nil || n != 0 {
		t.Fatalf("Release by the first claim = %d, %v; want 0", n, err)
	}
	after := []OutboxRow{mustDelivery(t, db, a), mustDelivery(t, db, b)}
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("rows changed by a stale release:\n%+v\nwas\n%+v", after, before)
	}
	// The second claim still releases its own.
	if n, err := db.Release(ctx, []int64{a}, make([]time.Time, 1), first.Add(time.Minute), first.Add(3*time.Second)); err != nil || n != 1 {
		t.Errorf("Release by the second claim = %d, %v; want 1", n, err)
	}
}

// TestLateOutcomeUnderALostLease: an outcome recorded under a lease the
// delivery no longer holds (claimed again, retried by hand, released) is
// logged but does not overwrite the delivery's newer state, alone or in a
// multi-row batch; under the lease it still holds, it applies.
func TestLateOutcomeUnderALostLease(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	lease := t0.Add(time.Minute)
	var ids []int64
	for i := range 4 {
		ids = append(ids, enqueue(t, db, "crm", fmt.Sprintf("evt_%d", i), "payment.succeeded", t0))
	}
	if got := claimIDs(t, db, "crm", t0, 10, time.Minute); !sameIDs(got, ids) {
		t.Fatalf("claim = %v", got)
	}
	reclaimed, retried, released, held := ids[0], ids[1], ids[2], ids[3]
	// While the attempts are in flight: another claim of one after the
	// lease ran out, a manual retry of one and a release of one.
	if got := claimIDs(t, db, "crm", lease, 1, time.Minute); !sameIDs(got, []int64{reclaimed}) {
		t.Fatalf("claim after the lease = %v, want [%d]", got, reclaimed)
	}
	if err := db.RetryDelivery(ctx, retried, lease.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Release(ctx, []int64{released}, make([]time.Time, 1), lease, lease.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, batch := range []bool{false, true} {
		before := map[int64]OutboxRow{}
		var items []AttemptOutcome
		for _, id := range []int64{retried, reclaimed, released} {
			before[id] = mustDelivery(t, db, id)
			items = append(items, AttemptOutcome{
				Attempt: Attempt{DeliveryID: id, Target: "crm", URL: "https://crm.example/hook", Attempt: 1, StatusCode: 200, At: t0.Add(90 * time.Second)},
				Outcome: Outcome{Status: StatusDelivered, Lease: lease},
			})
		}
		if batch {
			if _, err := db.RecordAttempts(ctx, items); err != nil {
				t.Fatalf("RecordAttempts: %v", err)
			}
		} else {
			for _, it := range items {
				if _, err := db.RecordAttempt(ctx, it.Attempt, it.Outcome); err != nil {
					t.Fatalf("RecordAttempt of %d: %v", it.Attempt.DeliveryID, err)
				}
			}
		}
		for id, was := range before {
			if got := mustDelivery(t, db, id); fmt.Sprint(got) != fmt.Sprint(was) {
				t.Errorf("batch %v: delivery %d changed by an outcome under a lost lease:\n%+v\nwas\n%+v", batch, id, got, was)
			}
		}
	}
	for _, id := range []int64{retried, reclaimed, released} {
		if as, err := db.Attempts(ctx, id); err != nil || len(as) != 2 {
			t.Errorf("delivery %d: %d attempts logged (%v), want both", id, len(as), err)
		}
	}
	// The lease still held: applied, in a batch with an unknown delivery
	// (which fails it) and then alone.
	items := []AttemptOutcome{
		{Attempt: Attempt{DeliveryID: held, Target: "crm", URL: "u", Attempt: 1, StatusCode: 200, At: t0}, Outcome: Outcome{Status: StatusDelivered, Lease: lease}},
		{Attempt: Attempt{DeliveryID: 999, Target: "crm", URL: "u", Attempt: 1, StatusCode: 200, At: t0}, Outcome: Outcome{Status: StatusDelivered, Lease: lease}},
	}
	if _, err := db.RecordAttempts(ctx, items); !errors.Is(err, backstop.ErrNotFound) {
		t.Errorf("RecordAttempts with an unknown delivery: %v, want ErrNotFound", err)
	}
	if _, err := db.RecordAttempts(ctx, items[:1]); err != nil {
		t.Fatal(err)
	}
	if r := mustDelivery(t, db, held); r.Status != StatusDelivered || r.Attempts != 1 {
		t.Errorf("delivery under its lease = %+v, want delivered after 1 attempt", r)
	}
}

// TestClaimReadsTheQueueIndex: a claim reads the due rows in claim order
// from outbox_due, without sorting every queued row of the target.
func TestClaimReadsTheQueueIndex(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	var plan []struct {
		ID      int    `db:"id"`
		Parent  int    `db:"parent"`
		NotUsed int    `db:"notused"`
		Detail  string `db:"detail"`
	}
	if err := db.r.SelectContext(ctx, &plan, `EXPLAIN QUERY PLAN `+claimSelectSQL, "crm", "2026", 10); err != nil {
		t.Fatal(err)
	}
	var details []string
	for _, p := range plan {
		details = append(details, p.Detail)
	}
	got := strings.Join(details, "; ")
	if !strings.Contains(got, "outbox_due") || strings.Contains(got, "TEMP B-TREE") {
		t.Errorf("claim plan %q, want a search of outbox_due and no sort", got)
	}
}

// TestRecordAttemptsInChunks: a batch recorded with multi-row statements
// (many deliveries, each once, no redirect) ends as RecordAttempt would
// leave each delivery, with the ids in recording order.
func TestRecordAttemptsInChunks(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	const n = 45 // 32 + 8 + 4 + 1
	var items []AttemptOutcome
	for i := range n {
		id := enqueue(t, db, "crm", fmt.Sprintf("evt_%d", i), "contact.created", t0)
		a := Attempt{DeliveryID: id, Target: "crm", URL: "https://crm.example/hook", Attempt: 1 + i%3,
			RequestID: fmt.Sprint("req_", i), Duration: time.Duration(i) * time.Millisecond, At: t0.Add(time.Duration(i) * time.Second)}
		var out Outcome
		switch i % 3 {
		case 0:
			a.StatusCode, out = 200, Outcome{Status: StatusDelivered}
		case 1:
			a.StatusCode, a.Body = 503, fmt.Sprint("busy ", i)
			out = Outcome{Status: StatusRetrying, NextAttemptAt: t0.Add(time.Hour), Failures: 1 + i%2}
		case 2:
			a.Error, out = "connection refused", Outcome{Status: StatusDeadLetter}
		}
		items = append(items, AttemptOutcome{a, out})
	}
	ids, err := db.RecordAttempts(ctx, items)
	if err != nil || len(ids) != n {
		t.Fatalf("RecordAttempts = %d ids, %v", len(ids), err)
	}
	for i, it := range items {
		if i > 0 && ids[i] <= ids[i-1] {
			t.Fatalf("ids %v not in recording order", ids)
		}
		a, out := it.Attempt, it.Outcome
		r := mustDelivery(t, db, a.DeliveryID)
		wantErr := a.Error
		if wantErr == "" {
			wantErr = a.Body
		}
		if r.Status != out.Status || r.Attempts != a.Attempt || r.Failures != out.Failures || r.LastStatus != a.StatusCode ||
			r.LastError != wantErr || !r.UpdatedAt.Equal(a.At) || !r.NextAttemptAt.Equal(out.NextAttemptAt) {
			t.Errorf("item %d: delivery %+v after %+v, %+v", i, r, a, out)
		}
		atts, err := db.Attempts(ctx, a.DeliveryID)
		if err != nil || len(atts) != 1 {
			t.Fatalf("item %d: Attempts = %v, %v", i, atts, err)
		}
		got := atts[0]
		a.ID = ids[i]
		if got != a {
			t.Errorf("item %d: logged %+v, want %+v", i, got, a)
		}
	}
	// The next attempt, recorded alone, takes the next id.
	if id := record(t, db, Attempt{DeliveryID: items[1].Attempt.DeliveryID, Attempt: 3, StatusCode: 200, At: t0},
		Outcome{Status: StatusDelivered}); id != ids[n-1]+1 {
		t.Errorf("next attempt id %d, want %d", id, ids[n-1]+1)
	}
}

// A payload queued through the webhook proxy and an event never take each
// other's place, whichever comes first: both get their row, the proxied one
// under the caller's key (its X-Event-Id), and a repeat of the key is still
// the row queued first.
func TestEnqueueKeysNeverMeetEventIDs(t *testing.T) {
	ctx := context.Background()
	db, _ := openFull(t)
	body := json.RawMessage(`{"content":"deploy finished"}`)

	// The proxy call first, then the webhook with the same id: the event
	// still gets its row for billing (and audit).
	px, err := db.Enqueue(ctx, "billing", "evt_future", "proxy", body, t0)
	if err != nil {
		t.Fatal(err)
	}
	if got := emit(t, db, testRoutes, payment(t, "evt_future", "pay_1", "2024-05-01T10:00:00Z")); got[0] != accepted(true, 2) {
		t.Fatalf("webhook after a proxy call with its id: %+v, want accepted with 2 outbox rows", got[0])
	}
	rows := outboxRows(t, db, "billing")
	if len(rows) != 2 {
		t.Fatalf("billing has %d rows, want the proxied payload and the event: %+v", len(rows), rows)
	}
	if r := rows[0]; r.ID != px || !r.Proxied || r.EventID != "evt_future" || r.EventType != "proxy" || string(r.Payload) != string(body) {
		t.Errorf("proxied row = %+v", r)
	}
	if r := rows[1]; r.Proxied || r.EventID != "evt_future" || r.EventType != "payment.succeeded" ||
		!strings.HasPrefix(string(r.Payload), `{"event_id":"evt_future","event":"payment.succeeded",`) {
		t.Errorf("event row = %+v", r)
	}

	// The webhook first, then a proxy call with its id: the call gets a
	// row of its own, with its body, and a repeat gets that row.
	emit(t, db, testRoutes, payment(t, "evt_past", "pay_2", "2024-05-01T10:00:00Z"))
	event := outboxRows(t, db, "billing")[2]
	other := json.RawMessage(`{"content":"another"}`)
	px2, err := db.Enqueue(ctx, "billing", "evt_past", "proxy", other, t0)
	if err != nil {
		t.Fatal(err)
	}
	if px2 == event.ID {
		t.Fatalf("Enqueue of an event's id returned the event's row %d", event.ID)
	}
	if r := mustDelivery(t, db, px2); !r.Proxied || r.EventID != "evt_past" || string(r.Payload) != string(other) {
		t.Errorf("proxied row = %+v, want the caller's body", r)
	}
	if r := mustDelivery(t, db, event.ID); r.Proxied || string(r.Payload) != string(event.Payload) {
		t.Errorf("the event's row changed: %+v", r)
	}
	for _, key := range []string{"evt_future", "evt_past"} {
		first := map[string]int64{"evt_future": px, "evt_past": px2}[key]
		if again, err := db.Enqueue(ctx, "billing", key, "proxy", mustDelivery(t, db, first).Payload, t0.Add(time.Hour)); err != nil || again != first {
			t.Errorf("repeated Enqueue of %s = %d, %v; want the first id %d", key, again, err, first)
		}
	}
	if n := len(outboxRows(t, db, "billing")); n != 4 {
		t.Errorf("billing has %d rows, want 4 (two events, two proxied payloads)", n)
	}

	// An event may not take an id of the proxied payloads' space.
	if _, err := db.Emit(ctx, []backstop.Event{payment(t, proxyEventID("evt_x"), "pay_3", "2024-05-01T10:00:00Z")}, testRoutes); err == nil {
		t.Error("Emit of an event whose id is a proxied row's key did not fail")
	}
}

// Enqueue refuses a payload that is not UTF-8, which json.Valid alone lets
// through.
func TestEnqueueRefusesInvalidUTF8(t *testing.T) {
	db, _ := openTest(t)
	if _, err := db.Enqueue(context.Background(), "crm", "k", "proxy", json.RawMessage("{\"a\":\"\xff\xfe\"}"), t0); err == nil ||
		!strings.Contains(err.Error(), "UTF-8") {
		t.Errorf("Enqueue of invalid UTF-8 = %v, want an error saying so", err)
	}
	if rows := outboxRows(t, db, ""); len(rows) != 0 {
		t.Errorf("outbox has %d rows", len(rows))
	}
}

// Rows the proxy of earlier versions wrote, under the caller's key as
// event_id, keep working once migration 0009 has run: they are proxied
// rows with their key and attempts, a repeat of the key still finds them,
// and they no longer hold the id of an event that comes later. The rows of
// events stay as they were.
func TestMigrationMovesEarlierProxiedRowsApart(t *testing.T) {
	ctx := context.Background()
	path := t.TempDir() + "/v8.db"
	w := openAtVersion(t, path, 8)
	insert := func(target, eventID, eventType, payload string) int64 {
		t.Helper()
		stamp := backstop.CanonicalTime(t0)
		res, err := w.ExecContext(ctx, `INSERT INTO outbox
			(target, event_id, event_type, payload, status, attempts, next_attempt_at, created_at, updated_at)
			VALUES (?, ?, ?, ?, 'pending', 0, ?, ?, ?)`, target, eventID, eventType, payload, stamp, stamp, stamp)
		if err != nil {
			t.Fatal(err)
		}
		id, err := res.LastInsertId()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	// Events' rows, with the envelope the emit path builds: one whose id
	// encoding/json writes with escapes (<, &) that json_quote does not.
	hook := payment(t, "evt_hook", "pay_1", "2024-05-01T10:00:00Z")
	escaped := payment(t, "evt_<a&b>", "pay_2", "2024-05-01T10:00:00Z")
	events := map[string]int64{
		hook.ID:    insert("billing", hook.ID, hook.Type, string(envelope(hook))),
		escaped.ID: insert("billing", escaped.ID, escaped.Type, string(envelope(escaped))),
	}
	// The old proxy's rows: any JSON, even one shaped as an envelope of
	// another id.
	proxied := map[string]struct {
		id      int64
		payload string
	}{}
	for key, payload := range map[string]string{
		"alert-1":     `{"content":"hi"}`,
		"evt_collide": `[1,2]`,
		"px-env":      `{"event_id":"other","event":"proxy","created_at":"2024-05-01T10:00:00Z","origin":"webhook","data":{}}`,
	} {
		proxied[key] = struct {
			id      int64
			payload string
		}{insert("billing", key, "proxy", payload), payload}
	}
	if _, err := w.ExecContext(ctx, `INSERT INTO delivery_attempts (delivery_id, target, url, attempt, status_code, at)
		VALUES (?, 'billing', 'https://billing.example.com', 1, 503, ?)`, proxied["alert-1"].id, backstop.CanonicalTime(t0)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	db, err := Open(ctx, path, Options{Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for id, row := range events {
		if r := mustDelivery(t, db, row); r.Proxied || r.EventID != id {
			t.Errorf("event %s's row after the migration: %+v", id, r)
		}
	}
	for key, p := range proxied {
		if r := mustDelivery(t, db, p.id); !r.Proxied || r.EventID != key || string(r.Payload) != p.payload || r.Status != StatusPending {
			t.Errorf("old proxied row %s after the migration: %+v", key, r)
		}
	}
	if as, err := db.Attempts(ctx, proxied["alert-1"].id); err != nil || len(as) != 1 || as[0].StatusCode != 503 {
		t.Errorf("old proxied row's attempts = %+v, %v; want its one attempt", as, err)
	}
	if id, err := db.Enqueue(ctx, "billing", "alert-1", "proxy", json.RawMessage(`{"content":"hi"}`), t0); err != nil || id != proxied["alert-1"].id {
		t.Errorf("repeat of an old proxied key = %d, %v; want its row %d", id, err, proxied["alert-1"].id)
	}
	if id, err := db.Enqueue(ctx, "billing", hook.ID, "proxy", json.RawMessage(`{}`), t0); err != nil || id == events[hook.ID] {
		t.Errorf("Enqueue of an old event's id = %d, %v; want a row of its own", id, err)
	}
	if got := emit(t, db, testRoutes, payment(t, "evt_collide", "pay_3", "2024-05-01T10:00:00Z")); got[0] != accepted(true, 2) {
		t.Errorf("webhook with an old proxied key's id: %+v, want accepted with 2 outbox rows", got[0])
	}
}

// Migration 0011 gives each queued or dead-lettered row of an earlier
// version the failures its attempts made: its attempts less the 429s
// logged for it (a 429 is not a failure), never below 0.
func TestMigration11CountsFailuresWithout429s(t *testing.T) {
	ctx := context.Background()
	path := t.TempDir() + "/v10.db"
	w := openAtVersion(t, path, 10)
	stamp := backstop.CanonicalTime(t0)
	insert := func(eventID, status string, attempts int, logged ...int) int64 {
		t.Helper()
		res, err := w.ExecContext(ctx, `INSERT INTO outbox
			(target, event_id, event_type, payload, status, attempts, next_attempt_at, created_at, updated_at)
			VALUES ('crm', ?, 'contact.created', '{}', ?, ?, ?, ?, ?)`, eventID, status, attempts, stamp, stamp, stamp)
		if err != nil {
			t.Fatal(err)
		}
		id, err := res.LastInsertId()
		if err != nil {
			t.Fatal(err)
		}
		for i, code := range logged {
			if _, err := w.ExecContext(ctx, `INSERT INTO delivery_attempts (delivery_id, target, url, attempt, status_code, at)
				VALUES (?, 'crm', 'https://crm.example', ?, ?, ?)`, id, i+1, code, stamp); err != nil {
				t.Fatal(err)
			}
		}
		return id
	}
	want := map[int64]int{
		insert("evt_new", StatusPending, 0):                                   0,
		insert("evt_limited", StatusRetrying, 5, 429, 429, 429, 429, 429):     0,
		insert("evt_mixed", StatusRetrying, 4, 429, 503, 429, 503):            2,
		insert("evt_pruned", StatusRetrying, 3):                               3, // its log pruned
		insert("evt_dead", StatusDeadLetter, 6, 429, 500, 500, 500, 500, 500): 5,
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := Open(ctx, path, Options{Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for id, failures := range want {
		if r := mustDelivery(t, db, id); r.Failures != failures {
			t.Errorf("row %s after the migration: %d attempts, %d failures; want %d failures", r.EventID, r.Attempts, r.Failures, failures)
		}
	}
}

// TestRetryRefusedWhileAttemptInFlight: a Retry of a delivery whose
// attempt is in flight (claimed, not yet recorded) would make it due at
// once, so it would be sent again even when that attempt succeeds. It is
// refused with backstop.ErrInFlight and changes nothing, by id or as seen on the
// dashboard; once the attempt is recorded, or its lease has run out (the
// process died mid-attempt), it is allowed again.
func TestRetryRefusedWhileAttemptInFlight(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	ok := enqueue(t, db, "crm", "evt_ok", "payment.succeeded", t0)
	failed := enqueue(t, db, "crm", "evt_failed", "payment.succeeded", t0)
	killed := enqueue(t, db, "crm", "evt_killed", "payment.succeeded", t0)
	lease := t0.Add(time.Minute)
	if got := claimIDs(t, db, "crm", t0, 10, time.Minute); !sameIDs(got, []int64{ok, failed, killed}) {
		t.Fatalf("claim = %v", got)
	}
	now := t0.Add(time.Second)
	for _, id := range []int64{ok, failed, killed} {
		before := mustDelivery(t, db, id)
		if err := db.RetryDelivery(ctx, id, now); !errors.Is(err, backstop.ErrInFlight) {
			t.Errorf("RetryDelivery(%d) in flight = %v, want ErrInFlight", id, err)
		}
		if done, err := db.RetryDeliveryAsSeen(ctx, id, before.Status, before.UpdatedAt, now); done || !errors.Is(err, backstop.ErrInFlight) {
			t.Errorf("RetryDeliveryAsSeen(%d) in flight = %v, %v; want ErrInFlight", id, done, err)
		}
		// A form drawn before the row last changed is told that, claimed
		// or not (a second submission of one Retry).
		if done, err := db.RetryDeliveryAsSeen(ctx, id, before.Status, before.UpdatedAt.Add(-time.Second), now); done || err != nil {
			t.Errorf("RetryDeliveryAsSeen(%d) of an older version, in flight = %v, %v; want false, nil", id, done, err)
		}
		if got := mustDelivery(t, db, id); fmt.Sprint(got) != fmt.Sprint(before) {
			t.Errorf("delivery %d changed by a refused retry:\n%+v\nwas\n%+v", id, got, before)
		}
	}
	if got := claimIDs(t, db, "crm", now, 10, time.Minute); len(got) != 0 {
		t.Errorf("rows in flight claimed again: %v", got)
	}

	// The attempts end: one delivered, one failed; their outcomes apply
	// (the lease is still theirs), and a retry is allowed again.
	record(t, db, Attempt{DeliveryID: ok, Attempt: 1, StatusCode: 200, At: now}, Outcome{Status: StatusDelivered, Lease: lease})
	record(t, db, Attempt{DeliveryID: failed, Attempt: 1, StatusCode: 503, At: now},
		Outcome{Status: StatusRetrying, NextAttemptAt: t0.Add(time.Hour), Failures: 1, Lease: lease})
	if row := mustDelivery(t, db, ok); row.Status != StatusDelivered {
		t.Fatalf("delivered attempt recorded as %+v", row)
	}
	for _, id := range []int64{ok, failed} {
		if err := db.RetryDelivery(ctx, id, now.Add(time.Second)); err != nil {
			t.Errorf("RetryDelivery(%d) after its attempt was recorded: %v", id, err)
		}
	}
	// The process that claimed the last one died: once the lease is over
	// it is due again, and may be retried.
	if err := db.RetryDelivery(ctx, killed, lease.Add(time.Second)); err != nil {
		t.Errorf("RetryDelivery after the lease ran out: %v", err)
	}
	if got := claimIDs(t, db, "crm", lease.Add(2*time.Second), 10, time.Minute); !sameIDs(got, []int64{ok, failed, killed}) {
		t.Errorf("claim after the retries = %v, want all three", got)
	}
}

// A delivered row keeps no last error: a 2xx's body ("ok") is no error.
// A failed attempt leaves its transport error, or else the answer's body.
func TestLastErrorIsNoSuccessBody(t *testing.T) {
	db, _ := openTest(t)
	ok := enqueue(t, db, "crm", "evt_ok", "payment.succeeded", t0)
	failed := enqueue(t, db, "crm", "evt_failed", "payment.succeeded", t0)
	broken := enqueue(t, db, "crm", "evt_broken", "payment.succeeded", t0)
	record(t, db, Attempt{DeliveryID: ok, Attempt: 1, StatusCode: 200, Body: "ok", At: t0}, Outcome{Status: StatusDelivered})
	record(t, db, Attempt{DeliveryID: failed, Attempt: 1, StatusCode: 503, Body: "busy", At: t0},
		Outcome{Status: StatusRetrying, NextAttemptAt: t0.Add(time.Minute), Failures: 1})
	record(t, db, Attempt{DeliveryID: broken, Attempt: 1, Error: "connection refused", At: t0},
		Outcome{Status: StatusRetrying, NextAttemptAt: t0.Add(time.Minute), Failures: 1})
	for id, want := range map[int64]string{ok: "", failed: "busy", broken: "connection refused"} {
		if got := mustDelivery(t, db, id).LastError; got != want {
			t.Errorf("delivery %d: last error %q, want %q", id, got, want)
		}
	}
}
