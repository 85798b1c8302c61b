package delivery

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// TestConcurrencyHoldsForRowsThatComeOneAtATime: with Concurrency 4, a
// request that hangs takes one of the target's four slots, not all of
// them: rows queued one at a time while it hangs are delivered meanwhile,
// and at most four requests are ever in flight.
func TestConcurrencyHoldsForRowsThatComeOneAtATime(t *testing.T) {
	t.Parallel()
	const n = 4
	var inFlight, most atomic.Int32
	hang := make(chan struct{})
	defer close(hang)
	rec := newRecorder(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		now := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
		}
		if r.Header.Get(HeaderEventID) == "evt_slow" {
			select {
			case <-hang:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(http.StatusOK)
	})
	q := newStoreQueue(t)
	slow := q.add(t, "crm", "evt_slow", "contact.created", `{"id":"ct_slow"}`)
	d := start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, Concurrency: n}}, Options{Poll: time.Hour})
	q.waitFor(t, 10*time.Second, "the slow request in flight", func() bool { return inFlight.Load() == 1 })
	for i := range 6 {
		id := q.add(t, "crm", fmt.Sprintf("evt_%d", i), "contact.created", `{"id":"ct_1"}`)
		d.Wake("crm")
		q.waitFor(t, 10*time.Second, fmt.Sprintf("row %d delivered while the slow one hangs", i), q.rowStatus(t, id, StatusDelivered))
	}
	if st := q.row(t, slow).Status; st == StatusDelivered {
		t.Fatalf("the slow row is %s, want still in flight", st)
	}
	if m := most.Load(); m > n {
		t.Errorf("%d requests were in flight at once, want at most %d", m, n)
	}
}
