package delivery

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
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
	rec, flight, release := hangingTarget(t, "evt_slow")
	defer release()
	q := newStoreQueue(t)
	slow := q.add(t, "crm", "evt_slow", "contact.created", `{"id":"ct_slow"}`)
	d := start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, Concurrency: n}}, Options{Poll: time.Hour})
	q.waitFor(t, 10*time.Second, "the slow request in flight", func() bool { return flight.now.Load() == 1 })
	for i := range 6 {
		id := q.add(t, "crm", fmt.Sprintf("evt_%d", i), "contact.created", `{"id":"ct_1"}`)
		d.Wake("crm")
		q.waitFor(t, 10*time.Second, fmt.Sprintf("row %d delivered while the slow one hangs", i), q.rowStatus(t, id, StatusDelivered))
	}
	if st := q.row(t, slow).Status; st == StatusDelivered {
		t.Fatalf("the slow row is %s, want still in flight", st)
	}
	if m := flight.most.Load(); m > n {
		t.Errorf("%d requests were in flight at once, want at most %d", m, n)
	}
}

// TestConcurrencyFillsEverySlotWithRowsThatComeOneAtATime: with
// Concurrency 4 and a target whose every answer takes long, rows queued
// one at a time each take a free slot at once. The refill that claimed a
// row sent it itself and started no sender for the slots still free, so
// the third and fourth rows waited for the first answer (found by an
// operator audit: rows came out in waves of 2, 4, 2).
func TestConcurrencyFillsEverySlotWithRowsThatComeOneAtATime(t *testing.T) {
	t.Parallel()
	const n = 4
	flight := &inFlight{}
	hang := make(chan struct{})
	rec := newRecorder(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		defer flight.enter()()
		select {
		case <-hang:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusOK)
	})
	q := newStoreQueue(t)
	var ids []int64
	ids = append(ids, q.add(t, "crm", "evt_0", "contact.created", `{"id":"ct_0"}`))
	d := start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, Concurrency: n, Timeout: time.Minute}}, Options{Poll: time.Hour})
	q.waitFor(t, 10*time.Second, "the first row in flight", func() bool { return flight.now.Load() == 1 })
	for i := 1; i < n+2; i++ {
		ids = append(ids, q.add(t, "crm", fmt.Sprintf("evt_%d", i), "contact.created", `{"id":"ct_1"}`))
		d.Wake("crm")
		want := int32(min(i+1, n))
		q.waitFor(t, 10*time.Second, fmt.Sprintf("%d rows in flight once row %d is queued", want, i), func() bool { return flight.now.Load() == want })
	}
	if m := flight.most.Load(); m > n {
		t.Errorf("%d requests were in flight at once, want at most %d", m, n)
	}
	close(hang)
	for _, id := range ids {
		q.waitFor(t, 10*time.Second, fmt.Sprintf("row %d delivered", id), q.rowStatus(t, id, StatusDelivered))
	}
}

// A target's allow_private lets its own private address be reached, and
// a redirect of its deliveries go to private addresses too, such as an
// inspector on the same network; but never to a link-local address, where
// the cloud's instance metadata (and its credentials) are served to
// whoever asks: the dashboard must not become a way to read them.
func TestRedirectNeverGoesToMetadataWithAllowPrivate(t *testing.T) {
	t.Parallel()
	inspector := newRecorder(t, status(http.StatusOK))
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
	d, err := New(q, []Target{{Name: "crm", URL: "http://10.1.2.3/hook", AllowPrivate: true, Timeout: 3 * time.Second, ConnectTimeout: 2 * time.Second}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	row := q.row(t, id)
	for _, u := range []string{"http://169.254.169.254/latest/meta-data/iam/", "http://169.254.1.1/", "http://[fe80::1]/",
		"http://[::ffff:169.254.169.254]/", "http://[64:ff9b::a9fe:a9fe]/",
		// AWS's IPv6 metadata address and Alibaba Cloud's, outside the
		// link-local ranges; a Teredo address whose server is private
		// but whose client is the metadata address.
		"http://[fd00:ec2::254]/", "http://100.100.100.200/", "http://[2001:0:a00:1::5601:5601]/"} {
		a, err := d.Redirect(context.Background(), row, u)
		if !errors.Is(err, ErrRefused) || !strings.Contains(a.Error, "a redirect never goes there") {
			t.Errorf("Redirect to %s from an allow_private target: %v (attempt error %q), want refused", u, err, a.Error)
		}
	}
	// A private address (here the loopback inspector) is still reached.
	if a, err := d.Redirect(context.Background(), row, inspector.srv.URL+"/inspect"); err != nil || a.StatusCode != 200 {
		t.Errorf("Redirect to a loopback inspector from an allow_private target: %v %+v", err, a)
	}
}

// Rows that come in bursts while a refill waits are all delivered without
// waiting for the worker's poll (an hour here): a wake the refill takes
// but cannot use all of is passed on.
func TestRefillLosesNoWake(t *testing.T) {
	t.Parallel()
	const rows = 150
	rec := newRecorder(t, func(k int, w http.ResponseWriter, r *http.Request) {
		if k%10 == 0 {
			timer := time.NewTimer(200 * time.Millisecond)
			select {
			case <-timer.C:
			case <-r.Context().Done():
				timer.Stop()
			}
		}
		w.WriteHeader(http.StatusOK)
	})
	q := newStoreQueue(t)
	first := q.add(t, "crm", "evt_first", "contact.created", `{"id":"ct_1"}`)
	d := start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, Concurrency: 4}}, Options{Poll: time.Hour})
	q.waitFor(t, 10*time.Second, "the first row delivered", q.rowStatus(t, first, StatusDelivered))
	ids := make([]int64, 0, rows)
	for i := range rows {
		ids = append(ids, q.add(t, "crm", fmt.Sprintf("evt_%d", i), "contact.created", `{"id":"ct_1"}`))
		if i%7 == 0 {
			d.Wake("crm") // a burst of up to 7 rows per wake, as an intake commit makes
		}
	}
	d.Wake("crm")
	for _, id := range ids {
		q.waitFor(t, 30*time.Second, fmt.Sprintf("row %d delivered without another wake or poll", id), q.rowStatus(t, id, StatusDelivered))
	}
}

// TestConcurrencyHoldsThroughABacklog: with Concurrency 4 and a backlog
// of several claims, a request that hangs holds one slot: the rest of the
// backlog, claim after claim, is delivered meanwhile, at most four in
// flight. With claims of 8 rows, the 400 rows are 50 claims: a pass used to
// let its requests drain every 16 claims, and so wait there for the
// hanging one.
func TestConcurrencyHoldsThroughABacklog(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{64, 8} {
		t.Run(fmt.Sprintf("claims of %d", batch), func(t *testing.T) {
			t.Parallel()
			const n, rows = 4, 400
			rec, flight, release := hangingTarget(t, "evt_5")
			defer release()
			q := newStoreQueue(t)
			ids := make([]int64, rows)
			for i := range rows {
				ids[i] = q.add(t, "crm", fmt.Sprintf("evt_%d", i), "contact.created", `{"id":"ct_1"}`)
			}
			// The hanging request outlasts every wait below (its Timeout
			// is a minute).
			start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, Concurrency: n, Timeout: time.Minute}},
				Options{Poll: time.Hour, Batch: batch})
			for i, id := range ids {
				if i == 5 {
					continue
				}
				q.waitFor(t, 30*time.Second, fmt.Sprintf("row %d delivered while evt_5 hangs", i), q.rowStatus(t, id, StatusDelivered))
			}
			if st := q.row(t, ids[5]).Status; st == StatusDelivered {
				t.Fatalf("the hanging row is %s, want still in flight", st)
			}
			if m := flight.most.Load(); m > n {
				t.Errorf("%d requests were in flight at once, want at most %d", m, n)
			}
		})
	}
}

// inFlight counts a test target's requests in flight, and the most there
// were at once.
type inFlight struct{ now, most atomic.Int32 }

// enter counts a request in; the returned func counts it out.
func (c *inFlight) enter() func() {
	now := c.now.Add(1)
	for m := c.most.Load(); now > m && !c.most.CompareAndSwap(m, now); m = c.most.Load() {
	}
	return func() { c.now.Add(-1) }
}

// hangingTarget is a target that answers 200 at once, but holds the
// request for event id hangID until release is called (defer it: before
// the dispatcher and the target stop, which would wait for it).
func hangingTarget(t *testing.T, hangID string) (rec *recorder, flight *inFlight, release func()) {
	t.Helper()
	flight = &inFlight{}
	hang := make(chan struct{})
	rec = newRecorder(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		defer flight.enter()()
		if r.Header.Get(HeaderEventID) == hangID {
			select {
			case <-hang:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(http.StatusOK)
	})
	return rec, flight, func() { close(hang) }
}
