package delivery

import (
	"context"
	"testing"
	"time"
)

// TestBatcherRecordsTheOthersWhenOneFails: attempts handed over together
// are recorded in one batch; when one of them cannot be recorded (its
// delivery is gone), the others still are, and every one gives its
// worker's token back.
func TestBatcherRecordsTheOthersWhenOneFails(t *testing.T) {
	q := newStoreQueue(t)
	ids := []int64{
		q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`),
		q.add(t, "crm", "evt_2", "contact.created", `{"id":"ct_2"}`),
	}
	d, err := New(q, []Target{{Name: "crm", URL: "https://crm.example.com/hook"}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	w := d.byName["crm"]
	now := time.Now()
	// Not started yet: the three attempts wait for one batch.
	for _, id := range []int64{ids[0], 999, ids[1]} {
		row := Row{ID: id, Target: "crm", EventID: "evt", CreatedAt: now}
		a := Attempt{DeliveryID: id, Target: "crm", URL: w.url, Attempt: 1, StatusCode: 200, RequestID: "req", At: now}
		d.record(w, row, a, Decision{Status: StatusDelivered}, now, time.Time{})
	}
	if n := len(w.unrecorded); n != 3 {
		t.Fatalf("%d attempts wait for their records, want 3", n)
	}
	go d.batcher.run(context.Background())
	d.batcher.close()
	select {
	case <-d.batcher.stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the batcher did not stop after close")
	}
	for _, id := range ids {
		if r := q.row(t, id); r.Status != StatusDelivered || r.Attempts != 1 {
			t.Errorf("row %d = %s after %d attempts, want delivered after 1", id, r.Status, r.Attempts)
		}
		if as := q.attemptsOf(t, id); len(as) != 1 {
			t.Errorf("row %d: %d attempts logged, want 1", id, len(as))
		}
	}
	if n := len(w.unrecorded); n != 0 {
		t.Errorf("%d tokens not given back, want 0", n)
	}
}

// TestBatcherCommitsOnceAttemptsStop: a lone attempt is recorded about
// recordQuiet after it came, not a whole RecordLinger later.
func TestBatcherCommitsOnceAttemptsStop(t *testing.T) {
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
	d, err := New(q, []Target{{Name: "crm", URL: "https://crm.example.com/hook"}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// A linger no test waits out: the quiet rule must commit the batch.
	d.batcher.linger = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	go d.batcher.run(ctx)
	t.Cleanup(func() {
		cancel()
		d.batcher.close()
		<-d.batcher.stopped
	})
	w := d.byName["crm"]
	now := time.Now()
	d.record(w, Row{ID: id, Target: "crm", CreatedAt: now},
		Attempt{DeliveryID: id, Target: "crm", URL: w.url, Attempt: 1, StatusCode: 200, RequestID: "req", At: now},
		Decision{Status: StatusDelivered}, now, time.Time{})
	q.waitFor(t, 10*time.Second, "the attempt recorded", func() bool { return q.deliveredOf("crm") == 1 })
}
