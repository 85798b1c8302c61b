package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/backstop-sync/backstop/cmd/backstop/config"
	"github.com/backstop-sync/backstop/internal/groupcommit"
	"github.com/backstop-sync/backstop/sinks/delivery"
	"github.com/backstop-sync/backstop/store"
)

// deliveryQueue adapts store.DB to the dispatcher's Queue (the same fields
// under the sinks package's own types: adapters do not import each other).
// Made by newDeliveryQueue, it records the attempts of all targets' workers
// in group commits; a bare deliveryQueue{db} records each attempt in its own
// transaction.
type deliveryQueue struct{ db deliveryStore }

var (
	_ delivery.Queue = deliveryQueue{}
	_ delivery.Queue = (*deliveryQueue)(nil)
)

// deliveryStore is what deliveryQueue needs of the store: *store.DB itself,
// or groupCommitStore.
type deliveryStore interface {
	ClaimDue(ctx context.Context, target string, now time.Time, limit int, lease time.Duration) ([]store.OutboxRow, error)
	RecordAttempt(ctx context.Context, a store.Attempt, out store.Outcome) (int64, error)
	Release(ctx context.Context, ids []int64, lease, now time.Time) (int64, error)
	PauseTarget(ctx context.Context, name string, until time.Time) error
	DisableTarget(ctx context.Context, name, reason string, now time.Time) error
	TargetQueue(ctx context.Context, name string) (store.TargetState, error)
}

// groupCommitStore is db whose RecordAttempt goes through a group-commit
// writer over db.RecordAttempts: the attempts recorded concurrently (one
// per target worker) share one transaction.
type groupCommitStore struct {
	*store.DB
	attempts *groupcommit.Writer[store.AttemptOutcome, int64]
}

// newDeliveryQueue returns a queue over db that group-commits attempts.
// Close it after the dispatcher over it has stopped and before db closes.
func newDeliveryQueue(db *store.DB) *deliveryQueue {
	w := groupcommit.New(db.RecordAttempts, groupcommit.Options{Linger: delivery.RecordLinger})
	// The commits run on their own context: an attempt whose answer is in
	// is recorded even while shutting down (Close waits for it).
	go w.Run(context.Background())
	return &deliveryQueue{db: groupCommitStore{DB: db, attempts: w}}
}

// Close records the attempts already submitted and stops the group-commit
// writer; RecordAttempt fails after it. It returns ctx.Err() when ctx ends
// first. Closing a bare deliveryQueue{db} does nothing.
func (q *deliveryQueue) Close(ctx context.Context) error {
	if g, ok := q.db.(groupCommitStore); ok {
		return g.attempts.Close(ctx)
	}
	return nil
}

// RecordAttempt records a in the next group commit and waits for it.
func (s groupCommitStore) RecordAttempt(ctx context.Context, a store.Attempt, out store.Outcome) (int64, error) {
	id, err := s.attempts.Submit(ctx, store.AttemptOutcome{Attempt: a, Outcome: out})
	if errors.Is(err, groupcommit.ErrClosed) {
		return 0, fmt.Errorf("record attempt %d of delivery %d: %w", a.Attempt, a.DeliveryID, err)
	}
	return id, err
}

func (q deliveryQueue) ClaimDue(ctx context.Context, target string, now time.Time, limit int, lease time.Duration) ([]delivery.Row, error) {
	return q.db.ClaimDue(ctx, target, now, limit, lease)
}

func (q deliveryQueue) RecordAttempt(ctx context.Context, a delivery.Attempt, o delivery.Outcome) (int64, error) {
	return q.db.RecordAttempt(ctx, a, o)
}

func (q deliveryQueue) Release(ctx context.Context, ids []int64, lease, now time.Time) error {
	_, err := q.db.Release(ctx, ids, lease, now)
	return err
}

func (q deliveryQueue) PauseTarget(ctx context.Context, name string, until time.Time) error {
	return q.db.PauseTarget(ctx, name, until)
}

func (q deliveryQueue) DisableTarget(ctx context.Context, name, reason string, now time.Time) error {
	return q.db.DisableTarget(ctx, name, reason, now)
}

func (q deliveryQueue) TargetQueue(ctx context.Context, name string) (delivery.TargetState, error) {
	return q.db.TargetQueue(ctx, name)
}

// deliveryTargets converts the configured targets for the dispatcher.
func deliveryTargets(cfg *config.Config) []delivery.Target {
	out := make([]delivery.Target, len(cfg.Targets))
	for i, t := range cfg.Targets {
		headers := make(map[string]string, len(t.Headers))
		for k, v := range t.Headers {
			headers[k] = v.Value()
		}
		schedule := make([]time.Duration, len(t.RetrySchedule))
		for j, d := range t.RetrySchedule {
			schedule[j] = d.Std()
		}
		out[i] = delivery.Target{
			Name: t.Name, URL: t.URL, Secret: t.Secret.Value(), Headers: headers,
			ConnectTimeout: t.ConnectTimeout.Std(), Timeout: t.Timeout.Std(),
			RetrySchedule: schedule, MaxPayload: t.MaxPayload, AllowPrivate: t.AllowPrivate,
			Concurrency: t.Concurrency,
		}
	}
	return out
}
