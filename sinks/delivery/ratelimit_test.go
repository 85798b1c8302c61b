package delivery

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// A 429 pauses the target but does not use up the row's retries: only
// failed attempts count towards the schedule and the dead letter after the
// 5th, while X-Delivery-Attempt and the attempt log count every attempt.
// Here the 5th attempt is the 4th failure, which the old count (every
// attempt) dead-lettered as past a schedule of four steps.
func TestRateLimitedAttemptsAreNotFailures(t *testing.T) {
	t.Parallel()
	answers := []int{429, 503, 503, 503, 503, 200}
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		code := answers[min(n, len(answers))-1]
		if code == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "0") // the 1 s floor
		}
		w.WriteHeader(code)
	})
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "payment.succeeded", `{"id":"pay_1"}`)
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, RetrySchedule: ms(5, 5, 5, 5)}}, Options{})

	q.waitFor(t, 20*time.Second, "delivery or dead letter", func() bool {
		s := q.row(t, id).Status
		return s == StatusDelivered || s == StatusDeadLetter
	})
	r := q.row(t, id)
	if r.Status != StatusDelivered || r.Attempts != 6 || r.Failures != 4 || r.LastStatus != 200 {
		t.Fatalf("row = %+v, want delivered on attempt 6 after 4 failures (%s)", r, r.LastError)
	}
	as := q.attemptsOf(t, id)
	if got, want := fmt.Sprint(codes(as)), fmt.Sprint(answers); got != want {
		t.Errorf("attempt codes %s, want %s", got, want)
	}
	for i, h := range rec.all() {
		if got := h.header.Get(HeaderDeliveryAttempt); got != fmt.Sprint(i+1) {
			t.Errorf("request %d: %s %q, want every attempt numbered", i+1, HeaderDeliveryAttempt, got)
		}
		if i < len(as) && as[i].Attempt != i+1 {
			t.Errorf("attempt log %d numbered %d", i+1, as[i].Attempt)
		}
	}
}
