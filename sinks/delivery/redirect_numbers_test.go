package delivery

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
)

// attemptNumbers returns the X-Delivery-Attempt of each hit, in order.
func attemptNumbers(hits []hit) []string {
	var out []string
	for _, h := range hits {
		out = append(out, h.header.Get(HeaderDeliveryAttempt))
	}
	return out
}

// queueOnly is a Queue and nothing more: Redirect finds no
// AttemptReserver behind it (a Queue of an earlier adapter).
type queueOnly struct{ Queue }

// TestRedirectsNumberEachAttemptOnce: a delivery that failed once,
// redirected twice to an inspector and then retried, is sent as attempts
// 1 (its target), 2 and 3 (the inspector), 4 (its target), and logged so:
// a redirect takes the next number and the delivery's count moves past it,
// its status and failures left as they were. With a queue that reserves
// numbers, and with one that does not (the redirects' records move the
// count).
func TestRedirectsNumberEachAttemptOnce(t *testing.T) {
	t.Parallel()
	for _, reserves := range []bool{true, false} {
		t.Run(fmt.Sprintf("reserves=%v", reserves), func(t *testing.T) {
			t.Parallel()
			target := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n == 1 {
					w.WriteHeader(http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusOK)
			})
			inspector := newRecorder(t, status(http.StatusOK))
			sq := newStoreQueue(t)
			var q Queue = sq
			if !reserves {
				q = queueOnly{sq}
			}
			id := sq.add(t, "crm", "evt_1475", "payment.succeeded", `{"id":"pay_1"}`)
			d := start(t, q, []Target{{Name: "crm", URL: target.srv.URL, AllowPrivate: true, RetrySchedule: []time.Duration{}}}, Options{})
			sq.waitFor(t, 10*time.Second, "dead letter", sq.rowStatus(t, id, StatusDeadLetter))
			for range 2 {
				row := sq.row(t, id) // as deliveries redirect reads it
				if _, err := d.Redirect(context.Background(), row, inspector.srv.URL+"/in"); err != nil {
					t.Fatalf("Redirect: %v", err)
				}
				if r := sq.row(t, id); r.Status != StatusDeadLetter || r.Failures != 1 || r.Attempts != row.Attempts+1 {
					t.Errorf("after a redirect: %+v, want dead letter, 1 failure, %d attempts", r, row.Attempts+1)
				}
			}
			if err := sq.db.RetryDelivery(context.Background(), id, time.Now()); err != nil {
				t.Fatal(err)
			}
			d.Wake("crm")
			sq.waitFor(t, 10*time.Second, "delivered", sq.rowStatus(t, id, StatusDelivered))
			if got := attemptNumbers(target.all()); fmt.Sprint(got) != "[1 4]" {
				t.Errorf("target got attempts %v, want [1 4]", got)
			}
			if got := attemptNumbers(inspector.all()); fmt.Sprint(got) != "[2 3]" {
				t.Errorf("inspector got attempts %v, want [2 3]", got)
			}
			var logged []string
			for _, a := range sq.attemptsOf(t, id) {
				s := strconv.Itoa(a.Attempt)
				if a.Redirect {
					s += "r"
				}
				logged = append(logged, s)
			}
			if fmt.Sprint(logged) != "[1 2r 3r 4]" {
				t.Errorf("attempts logged %v, want [1 2r 3r 4]", logged)
			}
			if r := sq.row(t, id); r.Attempts != 4 {
				t.Errorf("delivery counts %d attempts, want 4", r.Attempts)
			}
		})
	}
}

// TestRedirectOfARowInFlightIsRefused: while a row is claimed for sending
// its attempt in flight has the next number, so a redirect then (of the
// row as read before or after the claim) is refused with ErrInFlight,
// sending and recording nothing; once the attempt is recorded, it is
// redirected as the next attempt.
func TestRedirectOfARowInFlightIsRefused(t *testing.T) {
	t.Parallel()
	arrived, answer := make(chan struct{}, 1), make(chan struct{})
	target := newRecorder(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		arrived <- struct{}{}
		<-answer
		w.WriteHeader(http.StatusOK)
	})
	inspector := newRecorder(t, status(http.StatusOK))
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "payment.succeeded", `{"id":"pay_1"}`)
	readBefore := q.row(t, id)
	d := start(t, q, []Target{{Name: "crm", URL: target.srv.URL, AllowPrivate: true}}, Options{})
	<-arrived
	for name, row := range map[string]Row{"read before the claim": readBefore, "read while claimed": q.row(t, id)} {
		_, err := d.Redirect(context.Background(), row, inspector.srv.URL)
		var fl *backstop.InFlightError
		if !errors.As(err, &fl) || !errors.Is(err, backstop.ErrInFlight) || fl.Until.IsZero() {
			t.Errorf("%s: Redirect of a row in flight = %v, want an InFlightError", name, err)
		}
	}
	if n := len(inspector.all()); n != 0 {
		t.Errorf("the inspector got %d requests, want none", n)
	}
	close(answer)
	q.waitFor(t, 10*time.Second, "delivered", q.rowStatus(t, id, StatusDelivered))
	a, err := d.Redirect(context.Background(), q.row(t, id), inspector.srv.URL)
	if err != nil || a.Attempt != 2 {
		t.Errorf("Redirect once delivered = attempt %d, %v; want attempt 2", a.Attempt, err)
	}
	var nums []int
	for _, a := range q.attemptsOf(t, id) {
		nums = append(nums, a.Attempt)
	}
	if fmt.Sprint(nums) != "[1 2]" {
		t.Errorf("attempts logged %v, want [1 2]", nums)
	}
}

// TestRedirectsRacingAttemptsGetTheirOwnNumbers: redirects made over and
// over while the dispatcher retries the same row never share a number
// with each other or with the target's attempts, in the log or in
// X-Delivery-Attempt.
func TestRedirectsRacingAttemptsGetTheirOwnNumbers(t *testing.T) {
	t.Parallel()
	target := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n <= 4 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	inspector := newRecorder(t, status(http.StatusOK))
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "payment.succeeded", `{"id":"pay_1"}`)
	d := start(t, q, []Target{{Name: "crm", URL: target.srv.URL, AllowPrivate: true, RetrySchedule: ms(5, 5, 5, 5, 5, 5)}}, Options{})
	redirected, refused := 0, 0
	for q.row(t, id).Status != StatusDelivered && redirected < 30 {
		_, err := d.Redirect(context.Background(), q.row(t, id), inspector.srv.URL)
		switch {
		case errors.Is(err, backstop.ErrInFlight):
			refused++
		case err != nil:
			t.Fatalf("Redirect: %v", err)
		default:
			redirected++
		}
	}
	q.waitFor(t, 10*time.Second, "delivered", q.rowStatus(t, id, StatusDelivered))
	t.Logf("%d redirects, %d refused while in flight", redirected, refused)
	seen := map[string]string{}
	for who, hits := range map[string][]hit{"target": target.all(), "inspector": inspector.all()} {
		for _, n := range attemptNumbers(hits) {
			if other, dup := seen[n]; dup {
				t.Errorf("attempt number %s sent to the %s and to the %s", n, other, who)
			}
			seen[n] = who
		}
	}
	logged := map[int]bool{}
	atts := q.attemptsOf(t, id)
	for _, a := range atts {
		if logged[a.Attempt] {
			t.Errorf("attempt number %d logged twice", a.Attempt)
		}
		logged[a.Attempt] = true
	}
	if len(atts) != len(seen) {
		t.Errorf("%d attempts logged, %d sent", len(atts), len(seen))
	}
	if r := q.row(t, id); r.Attempts != len(atts) {
		t.Errorf("delivery counts %d attempts, %d logged", r.Attempts, len(atts))
	}
}
