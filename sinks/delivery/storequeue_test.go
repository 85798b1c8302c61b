package delivery

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/store"
)

// storeQueue is the dispatcher tests' Queue: the real store in a
// t.TempDir(), through the same few lines as cmd/backstop's deliveryQueue
// adapter (made by newDeliveryQueue). It adds what the tests wait on: a
// count of worker passes per target (one TargetQueue call each), a count
// of the deliveries committed as delivered per target, and a signal on
// every change made through it.
type storeQueue struct {
	db *store.DB

	// onCount, when set before the dispatcher starts, is called on every
	// TargetQueue that counts the queue (to make counting cost time on a
	// fake clock).
	onCount func()

	mu        sync.Mutex
	passes    map[string]int
	delivered map[string]int // outcomes committed as delivered, by target
	changed   chan struct{}  // closed and replaced on every change
}

var (
	_ Queue           = (*storeQueue)(nil)
	_ AttemptReserver = (*storeQueue)(nil)
)

// newStoreQueue opens a fresh store for the test and closes it at its end
// (after the dispatcher's cleanup, which was registered later).
func newStoreQueue(t testing.TB) *storeQueue {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "backstop.db"), store.Options{})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return &storeQueue{db: db, passes: map[string]int{}, delivered: map[string]int{}, changed: make(chan struct{})}
}

func (q *storeQueue) notify() {
	q.mu.Lock()
	defer q.mu.Unlock()
	close(q.changed)
	q.changed = make(chan struct{})
}

func (q *storeQueue) ClaimDue(ctx context.Context, target string, now time.Time, limit int, lease time.Duration) ([]Row, error) {
	return q.db.ClaimDue(ctx, target, now, limit, lease)
}

func (q *storeQueue) RecordAttempts(ctx context.Context, items []AttemptRecord) ([]int64, error) {
	defer q.notify()
	in := make([]store.AttemptOutcome, len(items))
	for i, it := range items {
		in[i] = store.AttemptOutcome{Attempt: it.Attempt, Outcome: it.Outcome}
	}
	ids, err := q.db.RecordAttempts(ctx, in)
	if err != nil {
		return nil, err
	}
	q.mu.Lock()
	for _, it := range items {
		if !it.Attempt.Redirect && it.Outcome.Status == StatusDelivered {
			q.delivered[it.Attempt.Target]++
		}
	}
	q.mu.Unlock()
	return ids, nil
}

// recordAttempt records one attempt, as the dispatcher would.
func (q *storeQueue) recordAttempt(t testing.TB, a Attempt, o Outcome) {
	t.Helper()
	if _, err := q.RecordAttempts(context.Background(), []AttemptRecord{{Attempt: a, Outcome: o}}); err != nil {
		t.Fatalf("record attempt: %v", err)
	}
}

func (q *storeQueue) Release(ctx context.Context, rows []Row, lease, now time.Time) error {
	defer q.notify()
	ids, due := make([]int64, len(rows)), make([]time.Time, len(rows))
	for i, r := range rows {
		ids[i], due[i] = r.ID, r.NextAttemptAt
	}
	_, err := q.db.Release(ctx, ids, due, lease, now)
	return err
}

// ReserveAttempt is the store's, as cmd/backstop's adapter gives it (see
// AttemptReserver).
func (q *storeQueue) ReserveAttempt(ctx context.Context, id int64, now time.Time) (int, error) {
	defer q.notify()
	return q.db.ReserveAttempt(ctx, id, now)
}

func (q *storeQueue) PauseTarget(ctx context.Context, name string, until time.Time) error {
	defer q.notify()
	return q.db.PauseTarget(ctx, name, until)
}

func (q *storeQueue) DisableTarget(ctx context.Context, name, reason string, now time.Time) error {
	defer q.notify()
	return q.db.DisableTarget(ctx, name, reason, now)
}

func (q *storeQueue) TargetQueue(ctx context.Context, name string, counts bool) (TargetState, error) {
	st, err := q.db.TargetQueue(ctx, name, counts)
	if err != nil {
		return TargetState{}, err
	}
	if counts && q.onCount != nil {
		q.onCount()
	}
	q.mu.Lock()
	q.passes[name]++
	q.mu.Unlock()
	q.notify()
	return TargetState(st), nil
}

// add queues an event for target with store.Enqueue and returns the row's
// id.
func (q *storeQueue) add(t testing.TB, target, eventID, eventType, data string) int64 {
	t.Helper()
	payload := fmt.Sprintf(`{"event_id":%q,"event":%q,"created_at":"2026-01-02T03:04:05Z","origin":"webhook","data":%s}`,
		eventID, eventType, data)
	id, err := q.db.Enqueue(context.Background(), target, eventID, eventType, json.RawMessage(payload), time.Now())
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	q.notify()
	return id
}

// emit queues to target, through the emit path, an event of a type of no
// resource (kept as it came) with data, and returns its outbox row: a
// delivery of an event, where add's is a proxied payload.
func (q *storeQueue) emit(t testing.TB, target, eventID, eventType, data string) int64 {
	t.Helper()
	ctx := context.Background()
	ev := backstop.Event{ID: eventID, Type: eventType, Origin: backstop.OriginWebhook, Data: json.RawMessage(data)}
	if _, err := q.db.Emit(ctx, []backstop.Event{ev}, []backstop.Route{{Target: target, Events: []string{"*"}}}); err != nil {
		t.Fatalf("emit: %v", err)
	}
	rows, err := q.db.OutboxRows(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.EventID == eventID && !r.Proxied {
			q.notify()
			return r.ID
		}
	}
	t.Fatalf("no outbox row of %s for %s", eventID, target)
	return 0
}

// row returns row id as the store holds it.
func (q *storeQueue) row(t testing.TB, id int64) Row {
	t.Helper()
	r, ok, err := q.db.Delivery(context.Background(), id)
	if err != nil || !ok {
		t.Fatalf("read delivery %d: ok %v, %v", id, ok, err)
	}
	return Row(r)
}

// attemptsOf returns the attempts recorded for row id, in order.
func (q *storeQueue) attemptsOf(t testing.TB, id int64) []Attempt {
	t.Helper()
	as, err := q.db.Attempts(context.Background(), id)
	if err != nil {
		t.Fatalf("read attempts of %d: %v", id, err)
	}
	out := make([]Attempt, len(as))
	for i, a := range as {
		out[i] = Attempt(a)
	}
	return out
}

// state returns the target's state as the store holds it, without
// counting a pass.
func (q *storeQueue) state(t testing.TB, name string) TargetState {
	t.Helper()
	states, err := q.db.TargetStates(context.Background(), []string{name})
	if err != nil {
		t.Fatalf("read state of %s: %v", name, err)
	}
	return TargetState(states[0])
}

// deliveredOf returns how many outcomes recorded through q for target were
// committed as delivered so far.
func (q *storeQueue) deliveredOf(target string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.delivered[target]
}

// passesOf returns how many worker passes looked at target so far.
func (q *storeQueue) passesOf(target string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.passes[target]
}

// waitFor waits until cond holds, checking it after every change made
// through q and at least every 10ms, or fails the test after timeout.
func (q *storeQueue) waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		q.mu.Lock()
		ch := q.changed
		q.mu.Unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
	}
}

// rowStatus is a condition on row id's status, for waitFor.
func (q *storeQueue) rowStatus(t testing.TB, id int64, status string) func() bool {
	return func() bool { return q.row(t, id).Status == status }
}
