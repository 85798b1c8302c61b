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
type deliveryQueue struct{ db *store.DB }

var _ delivery.Queue = deliveryQueue{}

func (q deliveryQueue) ClaimDue(ctx context.Context, target string, now time.Time, limit int, lease time.Duration) ([]delivery.Row, error) {
	rows, err := q.db.ClaimDue(ctx, target, now, limit, lease)
	if err != nil {
		return nil, err
	}
	out := make([]delivery.Row, len(rows))
	for i, r := range rows {
		out[i] = toDeliveryRow(r)
	}
	return out, nil
}

func (q deliveryQueue) RecordAttempt(ctx context.Context, a delivery.Attempt, o delivery.Outcome) (int64, error) {
	return q.db.RecordAttempt(ctx, store.Attempt(a), store.Outcome(o))
}

func (q deliveryQueue) PauseTarget(ctx context.Context, name string, until time.Time) error {
	return q.db.PauseTarget(ctx, name, until)
}

func (q deliveryQueue) DisableTarget(ctx context.Context, name, reason string, now time.Time) error {
	return q.db.DisableTarget(ctx, name, reason, now)
}

func (q deliveryQueue) TargetStates(ctx context.Context, names []string) ([]delivery.TargetState, error) {
	states, err := q.db.TargetStates(ctx, names)
	if err != nil {
		return nil, err
	}
	out := make([]delivery.TargetState, len(states))
	for i, s := range states {
		out[i] = delivery.TargetState(s)
	}
	return out, nil
}

func toDeliveryRow(r store.OutboxRow) delivery.Row { return delivery.Row(r) }

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
		}
	}
	return out
}
