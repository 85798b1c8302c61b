package main

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/backstop-sync/backstop/cmd/backstop/config"
	"github.com/backstop-sync/backstop/sinks/delivery"
	"github.com/backstop-sync/backstop/sources/governor"
)

// governorPacer lets the rate-limit governor pace a delivery target: the
// same code that paces the platform's API reads the target's
// X-RateLimit-* answers. With a rate_limit, a second governor (limit)
// counts every answer against that rate and never reads the target's
// headers, so the configured rate caps the target whatever its headers
// allow; the target's own budget binds when it is the smaller.
type governorPacer struct {
	g     *governor.Governor
	limit *governor.Governor // nil without a rate_limit
}

var _ delivery.PauseReporter = governorPacer{}

// PausedUntil implements delivery.PauseReporter: the end of the later of
// the two governors' 429 pauses (each doubles after consecutive 429s), so
// that what the dispatcher stores and logs after a 429 is when the target
// will really be tried again.
func (p governorPacer) PausedUntil(ctx context.Context) (time.Time, error) {
	st, err := p.g.State(ctx)
	if err != nil {
		return time.Time{}, err
	}
	until := st.PausedUntil
	if p.limit != nil {
		ls, err := p.limit.State(ctx)
		if err != nil {
			return time.Time{}, err
		}
		if ls.PausedUntil.After(until) {
			until = ls.PausedUntil
		}
	}
	return until, nil
}

// Acquire implements delivery.Pacer. The cap is taken last, right before
// the request is sent, so that a wait on the target's own budget is not
// spent holding it.
func (p governorPacer) Acquire(ctx context.Context) (delivery.PaceTicket, error) {
	t, err := p.g.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	if p.limit == nil {
		return t, nil
	}
	c, err := p.limit.Acquire(ctx)
	if err != nil {
		t.Abort()
		return nil, err
	}
	return cappedTicket{t, c}, nil
}

// cappedTicket is a request granted both by the target's budget and by its
// rate_limit.
type cappedTicket struct{ target, limit *governor.Ticket }

// Done implements delivery.PaceTicket. The rate_limit's governor gets the
// answer without its X-RateLimit-* headers, so that it counts the request
// against the configured rate; a 429's Retry-After pauses both.
func (t cappedTicket) Done(status int, h http.Header) {
	t.target.Done(status, h)
	var rest http.Header
	if ra := h.Values("Retry-After"); len(ra) > 0 {
		rest = http.Header{"Retry-After": ra}
	}
	t.limit.Done(status, rest)
}

// Abort implements delivery.PaceTicket.
func (t cappedTicket) Abort() {
	t.target.Abort()
	t.limit.Abort()
}

// targetPacers makes one pacer per target: a governor seeded from its
// rate_limit (or, without one, a budget that binds only once the target's
// own headers say so) and learning from its headers, and, with a
// rate_limit, a cap at that rate that holds whether or not the target
// sends headers. No requests are kept in reserve: a target's budget is its
// own.
func targetPacers(targets []config.Target, log *slog.Logger) map[string]delivery.Pacer {
	out := make(map[string]delivery.Pacer, len(targets))
	for _, t := range targets {
		limit, window, capped := 1_000_000, time.Minute, true
		switch rl := t.RateLimit; {
		case rl.PerSecond > 0:
			limit, window = rl.PerSecond, time.Second
		case rl.PerMinute > 0:
			limit, window = rl.PerMinute, time.Minute
		default:
			capped = false
		}
		p := governorPacer{g: governor.New("target:"+t.Name, governor.Options{
			Limit: limit, Window: window, Reserve: -1, Logger: log.With("target", t.Name),
		})}
		if capped {
			// Its 429 pauses repeat the target's: not logged twice.
			p.limit = governor.New("target-rate-limit:"+t.Name, governor.Options{
				Limit: limit, Window: window, Reserve: -1, Logger: slog.New(slog.DiscardHandler),
			})
		}
		out[t.Name] = p
	}
	return out
}
