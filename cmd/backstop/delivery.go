package main

import (
	"context"
	"time"

	"github.com/backstop-sync/backstop/cmd/backstop/config"
	"github.com/backstop-sync/backstop/sinks/delivery"
	"github.com/backstop-sync/backstop/store"
)

// deliveryQueue adapts store.DB to the dispatcher's Queue (the same fields
// under the sinks package's own types: adapters do not import each other).
// The dispatcher gathers the attempts of all its workers into batches
// itself, which RecordAttempts commits in one transaction each.
type deliveryQueue struct{ db deliveryStore }

var (
	_ delivery.Queue           = deliveryQueue{}
	_ delivery.AttemptReserver = deliveryQueue{}
)

// deliveryStore is what deliveryQueue needs of the store: *store.DB.
type deliveryStore interface {
	ClaimDue(ctx context.Context, target string, now time.Time, limit int, lease time.Duration) ([]store.OutboxRow, error)
	RecordAttempts(ctx context.Context, items []store.AttemptOutcome) ([]int64, error)
	Release(ctx context.Context, ids []int64, due []time.Time, lease, now time.Time) (int64, error)
	PauseTarget(ctx context.Context, name string, until time.Time) error
	DisableTarget(ctx context.Context, name, reason string, now time.Time) error
	TargetQueue(ctx context.Context, name string, counts bool) (store.TargetState, error)
	ReserveAttempt(ctx context.Context, id int64, now time.Time) (int, error)
}

// newDeliveryQueue returns a queue over db for a dispatcher.
func newDeliveryQueue(db *store.DB) deliveryQueue {
	return deliveryQueue{db: db}
}

func (q deliveryQueue) ClaimDue(ctx context.Context, target string, now time.Time, limit int, lease time.Duration) ([]delivery.Row, error) {
	return q.db.ClaimDue(ctx, target, now, limit, lease)
}

func (q deliveryQueue) RecordAttempts(ctx context.Context, items []delivery.AttemptRecord) ([]int64, error) {
	in := make([]store.AttemptOutcome, len(items))
	for i, it := range items {
		in[i] = store.AttemptOutcome{Attempt: it.Attempt, Outcome: it.Outcome}
	}
	return q.db.RecordAttempts(ctx, in)
}

func (q deliveryQueue) Release(ctx context.Context, rows []delivery.Row, lease, now time.Time) error {
	ids, due := make([]int64, len(rows)), make([]time.Time, len(rows))
	for i, r := range rows {
		ids[i], due[i] = r.ID, r.NextAttemptAt
	}
	_, err := q.db.Release(ctx, ids, due, lease, now)
	return err
}

func (q deliveryQueue) PauseTarget(ctx context.Context, name string, until time.Time) error {
	return q.db.PauseTarget(ctx, name, until)
}

func (q deliveryQueue) DisableTarget(ctx context.Context, name, reason string, now time.Time) error {
	return q.db.DisableTarget(ctx, name, reason, now)
}

func (q deliveryQueue) TargetQueue(ctx context.Context, name string, counts bool) (delivery.TargetState, error) {
	return q.db.TargetQueue(ctx, name, counts)
}

// ReserveAttempt gives a redirect of row id its own attempt number
// (delivery.AttemptReserver).
func (q deliveryQueue) ReserveAttempt(ctx context.Context, id int64, now time.Time) (int, error) {
	return q.db.ReserveAttempt(ctx, id, now)
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
