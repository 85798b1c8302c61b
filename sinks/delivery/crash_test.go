package delivery

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/store"
)

// openStoreQueue opens the store at path as a process would, for a test
// that closes it itself (a process that dies) or at its end (closeAtEnd).
func openStoreQueue(t *testing.T, path string, closeAtEnd bool) *storeQueue {
	t.Helper()
	db, err := store.Open(context.Background(), path, store.Options{})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	if closeAtEnd {
		t.Cleanup(func() {
			if err := db.Close(); err != nil {
				t.Errorf("close store: %v", err)
			}
		})
	}
	return &storeQueue{db: db, passes: map[string]int{}, delivered: map[string]int{}, changed: make(chan struct{})}
}

// eventIDs returns the X-Event-Id of each hit, in order, of those whose
// path is path (of all of them when path is empty).
func eventIDs(hits []hit, path string) []string {
	var out []string
	for _, h := range hits {
		if path == "" || h.path == path {
			out = append(out, h.header.Get(HeaderEventID))
		}
	}
	return out
}

// queueTen queues p01…p10 for crm, in that order.
func queueTen(t *testing.T, q *storeQueue) ([]int64, []string) {
	t.Helper()
	var ids []int64
	var want []string
	for i := 1; i <= 10; i++ {
		ev := fmt.Sprintf("p%02d", i)
		ids = append(ids, q.add(t, "crm", ev, "payment.succeeded", `{"id":"pay_1"}`))
		want = append(want, ev)
	}
	return ids, want
}

// allDelivered is a condition that every row of ids is delivered.
func allDelivered(t *testing.T, q *storeQueue, ids []int64) func() bool {
	return func() bool {
		for _, id := range ids {
			if q.row(t, id).Status != StatusDelivered {
				return false
			}
		}
		return true
	}
}

// TestQueueOrderAfterACrash: serve was SIGKILLed with rows claimed (its
// attempts in flight, or claimed ahead): no outcome recorded, nothing
// released. The next dispatcher on the store sends them at once, in queue
// order before the rows behind them (with concurrency 1, which keeps
// queue order), instead of after their lease (an hour here) and behind
// every other row, which gave a target an older version of a payment
// after a newer one.
func TestQueueOrderAfterACrash(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "backstop.db")
	dead := openStoreQueue(t, path, false)
	ids, want := queueTen(t, dead)
	claimed, err := dead.db.ClaimDue(context.Background(), "crm", time.Now(), 3, time.Hour)
	if err != nil || len(claimed) != 3 || claimed[0].ID != ids[0] {
		t.Fatalf("claim of the process that dies = %+v, %v", claimed, err)
	}
	// The process is gone: the OS releases its locks, its memory is lost.
	if err := dead.db.Close(); err != nil {
		t.Fatal(err)
	}

	rec := newRecorder(t, status(http.StatusOK))
	q := openStoreQueue(t, path, true)
	if r := q.row(t, ids[0]); r.ClaimedUntil.IsZero() {
		t.Fatalf("row claimed by the dead process = %+v, want still claimed before the restart", r)
	}
	started := time.Now()
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL + "/in", AllowPrivate: true}}, Options{})
	q.waitFor(t, 20*time.Second, "every row delivered (the dead claims' rows not held for their hour)", allDelivered(t, q, ids))
	if got := eventIDs(rec.all(), "/in"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("target got %v, want queue order %v", got, want)
	}
	if hits := rec.all(); len(hits) > 0 && hits[0].at.Sub(started) > 10*time.Second {
		t.Errorf("first row sent %v after the start, want at once", hits[0].at.Sub(started))
	}
	for _, id := range ids {
		if r := q.row(t, id); r.Attempts != 1 || !r.ClaimedUntil.IsZero() {
			t.Errorf("row %d = %d attempts, claimed until %v; want 1 attempt and no claim", id, r.Attempts, r.ClaimedUntil)
		}
	}
}

// errDead is what a queue whose process died answers.
var errDead = errors.New("the process is dead")

// dyingQueue is a storeQueue whose process dies once the record of a 429
// commits: from then on it writes and reads nothing (its dispatcher's
// attempts are never recorded, its rows never released).
type dyingQueue struct {
	*storeQueue
	dead atomic.Bool
	died chan struct{}
	once sync.Once
}

func (q *dyingQueue) ClaimDue(ctx context.Context, target string, now time.Time, limit int, lease time.Duration) ([]Row, error) {
	if q.dead.Load() {
		return nil, errDead
	}
	return q.storeQueue.ClaimDue(ctx, target, now, limit, lease)
}

func (q *dyingQueue) RecordAttempts(ctx context.Context, items []AttemptRecord) ([]int64, error) {
	if q.dead.Load() {
		return nil, errDead
	}
	ids, err := q.storeQueue.RecordAttempts(ctx, items)
	for _, it := range items {
		if err == nil && it.Attempt.StatusCode == http.StatusTooManyRequests {
			q.dead.Store(true)
			q.once.Do(func() { close(q.died) })
		}
	}
	return ids, err
}

func (q *dyingQueue) Release(ctx context.Context, rows []Row, lease, now time.Time) error {
	if q.dead.Load() {
		return errDead
	}
	return q.storeQueue.Release(ctx, rows, lease, now)
}

func (q *dyingQueue) PauseTarget(ctx context.Context, name string, until time.Time) error {
	if q.dead.Load() {
		return errDead
	}
	return q.storeQueue.PauseTarget(ctx, name, until)
}

func (q *dyingQueue) TargetQueue(ctx context.Context, name string, counts bool) (TargetState, error) {
	if q.dead.Load() {
		return TargetState{}, errDead
	}
	return q.storeQueue.TargetQueue(ctx, name, counts)
}

// TestRateLimitedRowKeepsItsPlaceAfterACrash: p01 got a 429, which keeps
// its place ("sent again first" once the pause ends), and serve was
// SIGKILLed during the pause with p01…p10 claimed. The next dispatcher
// waits out the stored pause, then sends p01 first and p02…p10 after it,
// at once: not p02…p10 first and p01 when its lease (an hour) ends.
func TestRateLimitedRowKeepsItsPlaceAfterACrash(t *testing.T) {
	t.Parallel()
	var first429 atomic.Bool
	rec := newRecorder(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/after":
			w.WriteHeader(http.StatusOK)
		case r.Header.Get(HeaderEventID) == "p01" && first429.CompareAndSwap(false, true):
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		default:
			// The dying process's later requests: not answered 2xx.
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	path := filepath.Join(t.TempDir(), "backstop.db")
	dq := &dyingQueue{storeQueue: openStoreQueue(t, path, false), died: make(chan struct{})}
	ids, want := queueTen(t, dq.storeQueue)
	d, err := New(dq, []Target{{Name: "crm", URL: rec.srv.URL + "/before", AllowPrivate: true}},
		Options{Poll: 20 * time.Millisecond, Lease: time.Hour, StopGrace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	select {
	case <-dq.died:
	case <-time.After(20 * time.Second):
		t.Fatal("no 429 recorded")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := dq.db.Close(); err != nil {
		t.Fatal(err)
	}

	q := openStoreQueue(t, path, true)
	pausedUntil := q.state(t, "crm").PausedUntil
	if pausedUntil.IsZero() {
		t.Fatal("the 429's pause was not stored")
	}
	if r := q.row(t, ids[0]); r.Attempts != 1 || r.Failures != 0 || r.ClaimedUntil.IsZero() {
		t.Fatalf("p01 after the crash = %+v, want 1 attempt, no failure, still claimed", r)
	}
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL + "/after", AllowPrivate: true}}, Options{})
	q.waitFor(t, 20*time.Second, "every row delivered (p01 not held for its claim's hour)", allDelivered(t, q, ids))
	var after []hit
	for _, h := range rec.all() {
		if h.path == "/after" {
			after = append(after, h)
		}
	}
	if got := eventIDs(after, "/after"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("target got %v after the restart, want p01 first, then queue order: %v", got, want)
	}
	if len(after) > 0 {
		if after[0].at.Before(pausedUntil) {
			t.Errorf("p01 sent at %v, within the stored pause (until %v)", after[0].at, pausedUntil)
		}
		if late := after[0].at.Sub(pausedUntil); late > 10*time.Second {
			t.Errorf("p01 sent %v after the pause ended, want at once", late)
		}
		if n := after[0].header.Get(HeaderDeliveryAttempt); n != "2" {
			t.Errorf("p01 sent as attempt %s, want 2 (after its 429)", n)
		}
	}
	if r := q.row(t, ids[0]); r.Attempts != 2 || r.Failures != 0 {
		t.Errorf("p01 = %d attempts, %d failures; want 2 and 0", r.Attempts, r.Failures)
	}
}

// claimCounter is a storeQueue that notes when each claim starts.
type claimCounter struct {
	*storeQueue
	mu     sync.Mutex
	claims []time.Time
}

func (q *claimCounter) ClaimDue(ctx context.Context, target string, now time.Time, limit int, lease time.Duration) ([]Row, error) {
	q.mu.Lock()
	q.claims = append(q.claims, time.Now())
	q.mu.Unlock()
	return q.storeQueue.ClaimDue(ctx, target, now, limit, lease)
}

// TestRateLimitPauseClaimsNothing: while a 429's pause holds a target's
// rows claimed at the head of its queue, its worker claims nothing (rows
// queued meanwhile wake it in vain), so no claim reads past the rows held;
// once the pause ends the row answered 429 goes first, then queue order.
func TestRateLimitPauseClaimsNothing(t *testing.T) {
	t.Parallel()
	var answered atomic.Value // when the 429 was answered
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			answered.Store(time.Now())
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	q := &claimCounter{storeQueue: newStoreQueue(t)}
	ids, want := queueTen(t, q.storeQueue)
	d := start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true}}, Options{})
	q.waitFor(t, 10*time.Second, "the pause stored", func() bool { return !q.state(t, "crm").PausedUntil.IsZero() })
	until := q.state(t, "crm").PausedUntil
	for i := 11; i <= 12; i++ {
		ev := fmt.Sprintf("p%02d", i)
		ids = append(ids, q.add(t, "crm", ev, "payment.succeeded", `{"id":"pay_1"}`))
		want = append(want, ev)
		d.Wake("crm")
	}
	q.waitFor(t, 20*time.Second, "every row delivered", allDelivered(t, q.storeQueue, ids))
	at, _ := answered.Load().(time.Time)
	q.mu.Lock()
	for _, c := range q.claims {
		if c.After(at) && c.Before(until) {
			t.Errorf("a claim at %v, during the pause (429 answered at %v, paused until %v)", c, at, until)
		}
	}
	q.mu.Unlock()
	if got := eventIDs(rec.all(), ""); fmt.Sprint(got) != fmt.Sprint(append([]string{"p01"}, want...)) {
		t.Errorf("target got %v, want the 429, then queue order %v", got, want)
	}
}
