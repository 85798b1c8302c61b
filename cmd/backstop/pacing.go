package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

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
//
// With a rate_limit, when the governors share their budgets in Redis
// (headers set), g is left out until the target first answers with
// rate-limit headers: until then its budget, seeded from the same rate and
// told the same answers as limit, adds nothing to the cap but two Redis
// round trips per delivery (and one more per pacing wait).
type governorPacer struct {
	g       *governor.Governor
	limit   *governor.Governor // nil without a rate_limit
	headers *atomic.Bool       // nil: g always; else g once it is true
	log     *slog.Logger       // says when headers turns true
}

var _ delivery.PauseReporter = governorPacer{}

// useTarget reports whether requests go through g.
func (p governorPacer) useTarget() bool { return p.headers == nil || p.headers.Load() }

// PausedUntil implements delivery.PauseReporter: the end of the later of
// the two governors' 429 pauses (each doubles after consecutive 429s), so
// that what the dispatcher stores and logs after a 429 is when the target
// will really be tried again.
func (p governorPacer) PausedUntil(ctx context.Context) (time.Time, error) {
	var until time.Time
	if p.useTarget() {
		st, err := p.g.State(ctx)
		if err != nil {
			return time.Time{}, err
		}
		until = st.PausedUntil
	}
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

var _ delivery.PauseLifter = governorPacer{}

// LiftPause implements delivery.PauseLifter: both governors' pauses end
// (g's only while requests go through it: else it has none, and lifting
// it would write a budget for nothing).
func (p governorPacer) LiftPause(ctx context.Context) error {
	var err error
	if p.useTarget() {
		err = p.g.LiftPause(ctx)
	}
	if p.limit != nil {
		err = errors.Join(err, p.limit.LiftPause(ctx))
	}
	return err
}

// Acquire implements delivery.Pacer. The cap is taken last, right before
// the request is sent, so that a wait on the target's own budget is not
// spent holding it.
func (p governorPacer) Acquire(ctx context.Context) (delivery.PaceTicket, error) {
	if p.limit != nil && !p.useTarget() {
		c, err := p.limit.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		return cappedTicket{limit: c, p: p}, nil
	}
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
	return cappedTicket{target: t, limit: c, p: p}, nil
}

// firstBudgetTimeout bounds the recording of a target's first rate-limit
// headers into its own budget (cappedTicket.Done): a grant on a budget that
// has no state yet, so it does not wait but for Redis.
const firstBudgetTimeout = 5 * time.Second

// cappedTicket is a request granted by its target's rate_limit and, unless
// target is nil (its pacer leaves g out until the target sends rate-limit
// headers), by the target's budget.
type cappedTicket struct {
	target, limit *governor.Ticket
	p             governorPacer
}

// Done implements delivery.PaceTicket. The rate_limit's governor gets the
// answer without its X-RateLimit-* headers, so that it counts the request
// against the configured rate; a 429's Retry-After pauses both (the cap
// alone while g is left out, which is enough: every request takes it).
func (t cappedTicket) Done(status int, h http.Header) {
	if t.target != nil {
		t.target.Done(status, h)
	} else if hasRateLimitHeaders(h) && t.p.headers.CompareAndSwap(false, true) {
		t.p.log.Info("target answers with rate-limit headers: pacing it by them too, through Redis with the other processes")
		// The budget this answer gives (say, none left until its reset)
		// is g's first: without it g would let the next request through
		// as if it knew nothing.
		ctx, cancel := context.WithTimeout(context.Background(), firstBudgetTimeout)
		if tk, err := t.p.g.Acquire(ctx); err == nil {
			tk.Done(status, h)
		} else {
			t.p.log.Warn("target governor: could not record the first rate-limit headers", "err", err)
		}
		cancel()
	}
	var rest http.Header
	if ra := h.Values("Retry-After"); len(ra) > 0 {
		rest = http.Header{"Retry-After": ra}
	}
	t.limit.Done(status, rest)
}

// Abort implements delivery.PaceTicket.
func (t cappedTicket) Abort() {
	if t.target != nil {
		t.target.Abort()
	}
	t.limit.Abort()
}

// hasRateLimitHeaders reports whether an answer carries a rate-limit budget
// the governor can read (X-RateLimit-Remaining, or Discord's
// X-RateLimit-Reset-After).
func hasRateLimitHeaders(h http.Header) bool {
	return h.Get("X-RateLimit-Remaining") != "" || h.Get("X-RateLimit-Reset-After") != ""
}

// headerPacer paces a target without a rate_limit, whose budget is only
// what its X-RateLimit-* headers say, when the target governors share
// their budgets in Redis: in the process (local) until the target first
// answers with such headers, then through Redis (shared), for good. A
// target that never sends them (most do not) costs no Redis round trip per
// delivery for a budget that never binds.
type headerPacer struct {
	local, shared governorPacer
	on            *atomic.Bool // shared from now on
	log           *slog.Logger
}

var _ delivery.PauseReporter = headerPacer{}

// Acquire implements delivery.Pacer.
func (p headerPacer) Acquire(ctx context.Context) (delivery.PaceTicket, error) {
	if p.on.Load() {
		return p.shared.Acquire(ctx)
	}
	t, err := p.local.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return watchedTicket{PaceTicket: t, p: p}, nil
}

// PausedUntil implements delivery.PauseReporter: the later of the two
// governors' pauses.
func (p headerPacer) PausedUntil(ctx context.Context) (time.Time, error) {
	until, err := p.local.PausedUntil(ctx)
	if err != nil || !p.on.Load() {
		return until, err
	}
	shared, err := p.shared.PausedUntil(ctx)
	if err != nil {
		return time.Time{}, err
	}
	if shared.After(until) {
		until = shared
	}
	return until, nil
}

var _ delivery.PauseLifter = headerPacer{}

// LiftPause implements delivery.PauseLifter: the pauses of the local
// governors, and of the shared ones once the target answered with
// rate-limit headers.
func (p headerPacer) LiftPause(ctx context.Context) error {
	err := p.local.LiftPause(ctx)
	if p.on.Load() {
		err = errors.Join(err, p.shared.LiftPause(ctx))
	}
	return err
}

// watchedTicket is a local ticket of a headerPacer: the first answer with
// rate-limit headers moves the pacer to the shared budget.
type watchedTicket struct {
	delivery.PaceTicket
	p headerPacer
}

// Done implements delivery.PaceTicket.
func (t watchedTicket) Done(status int, h http.Header) {
	t.PaceTicket.Done(status, h)
	if !hasRateLimitHeaders(h) {
		return
	}
	if t.p.on.CompareAndSwap(false, true) {
		t.p.log.Info("target answers with rate-limit headers: pacing it through Redis with the other processes")
	}
}

// targetRedisPrefix namespaces the target governors' budgets in Redis,
// apart from the API key's (governor.DefaultRedisPrefix + its key id):
// backstop:governor:target:<id>, the id a hash of the target's name and
// URL (and, for its rate_limit's cap, of the rate).
const targetRedisPrefix = governor.DefaultRedisPrefix + "target:"

// targetGovernorStore returns the store of the target governors. With
// governor.redis (rdb not nil), every process delivering to a target shares
// its budgets there, so that a rate_limit, and a budget learned from the
// target's headers, hold for all of them together; while Redis is
// unreachable each process paces alone at governor.fallback_share of them,
// as the API key's governor does. The store's probe of Redis in the
// background ends with ctx. Without Redis it returns nil: each target's
// governors keep their budgets in the process.
func targetGovernorStore(ctx context.Context, rdb *redis.Client, cfg *config.Config, log *slog.Logger) governor.Store {
	if rdb == nil || len(cfg.Targets) == 0 {
		return nil
	}
	// A process's requests in flight count for the others until its last
	// write plus DefaultHolderTTL, renewed while they are in flight.
	f := governor.NewFallbackStore(
		governor.NewRedisStore(rdb, governor.RedisOptions{Prefix: targetRedisPrefix}),
		governor.FallbackOptions{Share: cfg.Governor.FallbackShare, Logger: log},
	)
	context.AfterFunc(ctx, func() { f.Close() })
	log.Info("governor: sharing the targets' rate limits through Redis", "targets", len(cfg.Targets))
	return f
}

// deliveryPacers returns serve's target pacers: targetPacers over
// targetGovernorStore, shared through the app's Redis when it has one.
func (a *app) deliveryPacers(ctx context.Context, log *slog.Logger) map[string]delivery.Pacer {
	return targetPacers(a.cfg.Targets, targetGovernorStore(ctx, a.rdb, a.cfg, log), log)
}

// targetKey names a target's budget: its name and URL, so that processes
// sharing a Redis but not a configuration (another deployment with a
// target of the same name) do not share a budget by accident.
func targetKey(t config.Target) string { return t.Name + " " + t.URL }

// targetPacers makes one pacer per target: a governor seeded from its
// rate_limit (or, without one, a budget that binds only once the target's
// own headers say so) and learning from its headers, and, with a
// rate_limit, a cap at that rate that holds whether or not the target
// sends headers. No requests are kept in reserve: a target's budget is its
// own. The governors keep their budgets in store (see
// targetGovernorStore), shared by every process using it; nil gives each
// governor its own, so that the rate_limit holds per process.
func targetPacers(targets []config.Target, store governor.Store, log *slog.Logger) map[string]delivery.Pacer {
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
		key := targetKey(t)
		tlog := log.With("target", t.Name)
		p := governorPacer{g: governor.New("target:"+key, governor.Options{
			Limit: limit, Window: window, Reserve: -1, Store: store, Logger: tlog,
		})}
		if !capped && store != nil {
			// Shared only once the target's headers give it a budget.
			local := governorPacer{g: governor.New("target:"+key, governor.Options{
				Limit: limit, Window: window, Reserve: -1, Logger: tlog,
			})}
			out[t.Name] = headerPacer{local: local, shared: p, on: new(atomic.Bool), log: tlog}
			continue
		}
		if capped {
			// Its 429 pauses repeat the target's: not logged twice.
			// Its key names the rate too: processes configured with
			// another rate (during a change of it) keep their own cap
			// rather than apply whichever rate seeded the shared one.
			p.limit = governor.New(fmt.Sprintf("target-rate-limit:%s %d/%s", key, limit, window), governor.Options{
				Limit: limit, Window: window, Reserve: -1, Store: store, Logger: slog.New(slog.DiscardHandler),
			})
			if store != nil {
				// The target's own budget only once it sends headers
				// (see governorPacer).
				p.headers, p.log = new(atomic.Bool), tlog
			}
		}
		out[t.Name] = p
	}
	return out
}
