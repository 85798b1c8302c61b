package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/backstop-sync/backstop/internal/syncbuf"
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
		d.record(w, row, a, Decision{Status: StatusDelivered}, now, time.Time{}, now.Add(recordTimeout))
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
		Decision{Status: StatusDelivered}, now, time.Time{}, now.Add(recordTimeout))
	q.waitFor(t, 10*time.Second, "the attempt recorded", func() bool { return q.deliveredOf("crm") == 1 })
}

// stuckQueue is a storeQueue whose store cannot commit an attempt (another
// process holds its write lock, say): each RecordAttempts call waits until
// its ctx ends, then fails.
type stuckQueue struct {
	*storeQueue
	entered chan struct{} // closed by the first RecordAttempts call
	once    sync.Once
}

func (q *stuckQueue) RecordAttempts(ctx context.Context, _ []AttemptRecord) ([]int64, error) {
	q.once.Do(func() { close(q.entered) })
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(time.Minute): // a ctx without a deadline: give up
		return nil, errors.New("stuck store: no deadline")
	}
}

// TestStuckStoreGivesRecordsUpWithinTheirRoom: while the store cannot
// commit, the record of each answered attempt is given up recordTimeout
// after its answer, the room its lease keeps for it (a row is sent only
// while its lease has its Timeout and recordTimeout left), however many
// attempts wait together: a batch that fails is not retried attempt by
// attempt with a fresh recordTimeout each, which would hold every worker
// (tokens) and Run (shutdown) for that many times recordTimeout, and
// commit outcomes long after their leases ended, when the rows may have
// been claimed and sent again. Each failure is logged, and the rows stay
// leased, due again when their lease ends.
func TestStuckStoreGivesRecordsUpWithinTheirRoom(t *testing.T) {
	t.Parallel()
	sq := newStoreQueue(t)
	q := &stuckQueue{storeQueue: sq, entered: make(chan struct{})}
	const rows = 3
	var ids []int64
	for i := range rows {
		ids = append(ids, sq.add(t, "crm", fmt.Sprintf("evt_%d", i), "contact.created", `{"id":"ct_1"}`))
	}
	rec := newRecorder(t, status(http.StatusOK))
	var logs syncbuf.Buffer
	d, err := New(q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, Concurrency: rows}},
		Options{Poll: time.Hour, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	returned := false
	t.Cleanup(func() {
		cancel()
		if !returned {
			<-done // before the store closes
		}
	})
	<-q.entered
	sq.waitFor(t, 10*time.Second, "every row answered", func() bool { return len(rec.all()) == rows })
	answered := time.Now() // the last answer came before
	cancel()
	limit := recordTimeout + 3*time.Second
	select {
	case err := <-done:
		returned = true
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(time.Until(answered.Add(limit))):
		t.Fatalf("Run did not return within %v of the last answer: the records outlived their room", limit)
	}
	for _, id := range ids {
		if r := sq.row(t, id); r.Status != StatusPending || r.Attempts != 0 || !r.ClaimedUntil.After(time.Now()) {
			t.Errorf("row %d = %s, %d attempts, claimed until %v: want pending, unattempted and leased", id, r.Status, r.Attempts, r.ClaimedUntil)
		}
	}
	if n := strings.Count(logs.String(), `msg="record attempt"`); n != rows {
		t.Errorf("%d record failures logged, want %d:\n%s", n, rows, logs.String())
	}
	if n := len(d.byName["crm"].unrecorded); n != 0 {
		t.Errorf("%d tokens not given back, want 0", n)
	}
}

// shortQueue is a storeQueue whose RecordAttempts returns one id fewer
// than the attempts it was given, as a faulty Queue might.
type shortQueue struct{ *storeQueue }

func (q shortQueue) RecordAttempts(ctx context.Context, items []AttemptRecord) ([]int64, error) {
	ids, err := q.storeQueue.RecordAttempts(ctx, items)
	if len(ids) > 0 {
		ids = ids[:len(ids)-1]
	}
	return ids, err
}

// TestShortRecordResultIsAnError: a Queue that returns fewer ids than
// attempts makes the record fail, logged, instead of panicking the
// batcher's goroutine.
func TestShortRecordResultIsAnError(t *testing.T) {
	t.Parallel()
	sq := newStoreQueue(t)
	sq.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
	rec := newRecorder(t, status(http.StatusOK))
	var logs syncbuf.Buffer
	reg := prometheus.NewRegistry()
	d, err := New(shortQueue{sq}, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true}},
		Options{Poll: time.Hour, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	sq.waitFor(t, 10*time.Second, "the failure logged", func() bool {
		return strings.Contains(logs.String(), "returned 0 ids")
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := testutil.ToFloat64(d.metrics.unrecorded.WithLabelValues("crm")); got != 1 {
		t.Errorf("backstop_delivery_record_failures_total{target=crm} = %v, want 1", got)
	}
}

// TestFailingTargetLogsOnceUntilItDeliversAgain: a failing target used to
// log a line per failed attempt (1,212 lines in 8 s for one target). Its
// first failure is a warning saying further ones are debug lines, its
// retries are debug lines, a delivery after failures is logged once, and
// the next failure is a warning again; dead letters stay warnings.
func TestFailingTargetLogsOnceUntilItDeliversAgain(t *testing.T) {
	q := newStoreQueue(t)
	var logs syncbuf.Buffer
	d, err := New(q, []Target{{Name: "crm", URL: "https://crm.example.com/hook"}},
		Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	w := d.byName["crm"]
	now := time.Now()
	outcomes := []string{StatusRetrying, StatusRetrying, StatusRetrying, StatusRetrying, StatusDelivered, StatusDelivered,
		StatusRetrying, StatusDeadLetter, StatusRetrying}
	for i, status := range outcomes {
		id := q.add(t, "crm", fmt.Sprintf("evt_%d", i), "contact.created", `{"id":"ct_1"}`)
		row := Row{ID: id, Target: "crm", EventID: fmt.Sprintf("evt_%d", i), CreatedAt: now}
		code, dec := 200, Decision{Status: status}
		if status != StatusDelivered {
			code, dec = 500, Decision{Status: status, Reason: "HTTP 500", Failures: 1, NextAttemptAt: now.Add(time.Hour)}
		}
		a := Attempt{DeliveryID: id, Target: "crm", URL: w.url, Attempt: 1, StatusCode: code, RequestID: "req", At: now}
		d.record(w, row, a, dec, now, time.Time{}, now.Add(recordTimeout))
	}
	go d.batcher.run(context.Background())
	d.batcher.close()
	select {
	case <-d.batcher.stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the batcher did not stop after close")
	}
	out := logs.String()
	if n := strings.Count(out, "will retry"); n != 0 {
		t.Errorf("%d retries logged above debug, want 0:\n%s", n, out)
	}
	warn := "level=WARN msg=\"target failing; further failures at debug until it delivers again\" component=delivery target=crm reason=\"HTTP 500\""
	if n := strings.Count(out, warn); n != 2 {
		t.Errorf("%d warnings that the target fails, want 2 (its first failure, and the first after it delivered again):\n%s", n, out)
	}
	if n := strings.Count(out, `level=INFO msg="target delivers again" component=delivery target=crm failed_attempts=4`); n != 1 {
		t.Errorf("%d lines saying the target delivers again after 4 failed attempts, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, `msg=dead-lettered`); n != 1 || !strings.Contains(out, "level=WARN msg=dead-lettered") {
		t.Errorf("%d dead letters logged, want 1 warning:\n%s", n, out)
	}
	if n := strings.Count(out, "\n"); n != 4 {
		t.Errorf("%d lines for 9 attempts, want 4:\n%s", n, out)
	}
	if got := testutil.ToFloat64(w.m.attempt(StatusRetrying)); got != 6 {
		t.Errorf("retrying attempts counted %v, want 6", got)
	}
}
