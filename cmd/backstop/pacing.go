package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/backstop-sync/backstop/cmd/backstop/config"
	"github.com/backstop-sync/backstop/sinks/delivery"
	"github.com/backstop-sync/backstop/sources/governor"
)

// governorPacer lets the rate-limit governor pace a delivery target: the
// same code that paces the platform's API reads the target's
// X-RateLimit-* answers.
type governorPacer struct{ g *governor.Governor }

// Acquire implements delivery.Pacer.
func (p governorPacer) Acquire(ctx context.Context) (delivery.PaceTicket, error) {
	t, err := p.g.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// targetPacers makes one governor per target, seeded from its rate_limit
// (or, without one, a budget that binds only once the target's own headers
// say so). No requests are kept in reserve: a target's budget is its own.
func targetPacers(targets []config.Target, log *slog.Logger) map[string]delivery.Pacer {
	out := make(map[string]delivery.Pacer, len(targets))
	for _, t := range targets {
		limit, window := 1_000_000, time.Minute
		switch rl := t.RateLimit; {
		case rl.PerSecond > 0:
			limit, window = rl.PerSecond, time.Second
		case rl.PerMinute > 0:
			limit, window = rl.PerMinute, time.Minute
		}
		out[t.Name] = governorPacer{governor.New("target:"+t.Name, governor.Options{
			Limit: limit, Window: window, Reserve: -1, Logger: log.With("target", t.Name),
		})}
	}
	return out
}
