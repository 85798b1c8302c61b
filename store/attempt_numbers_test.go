package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
)

// TestRedirectsTakeTheirOwnAttemptNumbers: every attempt of a delivery,
// redirects included, has its own number. A redirect takes the next one
// (ReserveAttempt) and the delivery's count moves past it, leaving its
// status, failures and next attempt as they were; the next attempt of its
// target gets the number after it.
func TestRedirectsTakeTheirOwnAttemptNumbers(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	id := enqueue(t, db, "crm", "evt_1475", "payment.succeeded", t0)
	if got := claimIDs(t, db, "crm", t0, 1, time.Minute); !sameIDs(got, []int64{id}) {
		t.Fatalf("claim = %v", got)
	}
	next := t0.Add(time.Hour)
	record(t, db, Attempt{DeliveryID: id, Target: "crm", URL: "u", Attempt: 1, StatusCode: 500, At: t0},
		Outcome{Status: StatusRetrying, NextAttemptAt: next, Failures: 1, Lease: t0.Add(time.Minute)})
	before := mustDelivery(t, db, id)
	for _, want := range []int{2, 3} {
		n, err := db.ReserveAttempt(ctx, id, t0.Add(time.Second))
		if err != nil || n != want {
			t.Fatalf("ReserveAttempt = %d, %v; want %d", n, err, want)
		}
		record(t, db, Attempt{DeliveryID: id, Target: "crm", URL: "https://inspector.example/in", Attempt: n,
			StatusCode: 200, Redirect: true, At: t0.Add(time.Second)}, Outcome{})
	}
	want := before
	want.Attempts = 3
	if r := mustDelivery(t, db, id); fmt.Sprint(r) != fmt.Sprint(want) {
		t.Errorf("delivery after two redirects:\n%+v\nwant\n%+v", r, want)
	}
	if err := db.RetryDelivery(ctx, id, t0.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	rows, err := db.ClaimDue(ctx, "crm", t0.Add(2*time.Second), 1, time.Minute)
	if err != nil || len(rows) != 1 || rows[0].Attempts != 3 {
		t.Fatalf("claim after the retry = %+v, %v; want the row with 3 attempts (the next is 4)", rows, err)
	}
	lease := t0.Add(2*time.Second + time.Minute)
	// While claimed, its attempt in flight has the next number: a redirect
	// is refused, changing nothing.
	if _, err := db.ReserveAttempt(ctx, id, t0.Add(3*time.Second)); !errors.Is(err, backstop.ErrInFlight) {
		t.Errorf("ReserveAttempt while claimed = %v, want ErrInFlight", err)
	} else if fl := (*backstop.InFlightError)(nil); !errors.As(err, &fl) || !fl.Until.Equal(lease) {
		t.Errorf("ReserveAttempt while claimed = %v, want claimed until %v", err, lease)
	}
	record(t, db, Attempt{DeliveryID: id, Target: "crm", URL: "u", Attempt: rows[0].Attempts + 1, StatusCode: 200, At: t0.Add(3 * time.Second)},
		Outcome{Status: StatusDelivered, Lease: lease})
	atts, err := db.Attempts(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var nums []int
	for _, a := range atts {
		nums = append(nums, a.Attempt)
	}
	if fmt.Sprint(nums) != "[1 2 3 4]" {
		t.Errorf("attempts logged %v, want [1 2 3 4]", nums)
	}
	if r := mustDelivery(t, db, id); r.Attempts != 4 || r.Status != StatusDelivered {
		t.Errorf("delivery = %+v, want delivered after 4 attempts", r)
	}
	// A redirect of a delivered row is numbered on too.
	if n, err := db.ReserveAttempt(ctx, id, t0.Add(4*time.Second)); err != nil || n != 5 {
		t.Errorf("ReserveAttempt of the delivered row = %d, %v; want 5", n, err)
	}
	if _, err := db.ReserveAttempt(ctx, 999, t0); !errors.Is(err, backstop.ErrNotFound) {
		t.Errorf("ReserveAttempt of no delivery = %v, want ErrNotFound", err)
	}
}

// TestRedirectRecordMovesTheCountPastIt: a redirect recorded with the
// number after the delivery's count (as a caller that read the row
// numbers it) moves the count to it, so two redirects in a row and then
// the target's next attempt get three numbers; a redirect numbered below
// the count leaves it.
func TestRedirectRecordMovesTheCountPastIt(t *testing.T) {
	db, _ := openTest(t)
	id := enqueue(t, db, "crm", "evt_1", "payment.succeeded", t0)
	record(t, db, Attempt{DeliveryID: id, Target: "crm", URL: "u", Attempt: 1, StatusCode: 400, At: t0},
		Outcome{Status: StatusDeadLetter, Failures: 1})
	for range 2 {
		n := mustDelivery(t, db, id).Attempts + 1
		record(t, db, Attempt{DeliveryID: id, Target: "crm", URL: "https://inspector.example/in", Attempt: n,
			StatusCode: 200, Redirect: true, At: t0}, Outcome{})
	}
	record(t, db, Attempt{DeliveryID: id, Target: "crm", URL: "https://inspector.example/in", Attempt: 2,
		StatusCode: 200, Redirect: true, At: t0}, Outcome{})
	if r := mustDelivery(t, db, id); r.Attempts != 3 || r.Status != StatusDeadLetter || r.Failures != 1 {
		t.Errorf("dead letter after the redirects = %+v, want 3 attempts, still dead with 1 failure", r)
	}
}
