package governor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults of FallbackOptions.
const (
	// DefaultFallbackShare is the part of a key's budget one process uses
	// while the shared store is unreachable.
	DefaultFallbackShare = 0.25
	// DefaultFallbackRetry is how often the shared store is tried again
	// while it is unreachable.
	DefaultFallbackRetry = time.Second
)

// A background probe of the shared store is given Retry to answer, at least
// minProbeTimeout (a Redis dial may take a moment) and at most
// maxProbeTimeout; the Redis client's own timeouts are usually shorter.
const (
	minProbeTimeout = 2 * time.Second
	maxProbeTimeout = 5 * time.Second
)

// FallbackOptions configure a FallbackStore. Zero fields take the defaults.
type FallbackOptions struct {
	// Share (0..1] scales the budget while the shared store is unreachable:
	// the limit, what the platform says remains and the reserve. With N
	// processes on a key, 1/N keeps them together inside the limit.
	Share float64
	// Retry is how often the shared store is tried again meanwhile.
	Retry time.Duration
	// Logger receives the switches to local pacing and back; the caller's
	// logger names the component (the store adds none).
	Logger *slog.Logger
}

// FallbackStats counts a FallbackStore's switches to local pacing.
type FallbackStats struct {
	// Fallbacks counts the times the shared store became unreachable.
	Fallbacks int64
	// LocalGrants counts the requests granted by local pacing.
	LocalGrants int64
	// Local reports whether the store is pacing locally now.
	Local bool
}

// FallbackStore is a Store that uses a shared store (RedisStore) while it
// answers and paces locally, at Share of the budget, while it does not:
// losing Redis in the middle of a run slows the process down instead of
// stopping it or letting it take a whole key's budget. The shared store is
// tried again every Retry by a probe in the background, so that the calls
// made meanwhile never wait on it and a process making no calls (or only
// Snapshots) still notices it is back; its first answer switches back.
// The probe runs only while pacing locally: it starts with the fallback and
// ends on the switch back, on Close, or once the shared store's Redis
// client has been closed. Without it (after Close), one of the calls made
// meanwhile tries the shared store once per Retry instead.
//
// The local budget follows every response, also while the shared store
// answers, so it knows the window and any 429 pause at the moment it takes
// over. A request is always observed by the store that granted it.
type FallbackStore struct {
	shared Store
	share  float64
	retry  time.Duration
	log    *slog.Logger

	mu      sync.Mutex
	local   bool
	nextTry time.Time
	trying  bool
	// live is done once the shared store has failed, so that the calls
	// still waiting on it give up and pace locally rather than each
	// waiting out its own timeout; a new one starts when it answers again.
	live      context.Context
	endLive   context.CancelFunc
	budgets   map[string]*Budget
	grants    map[grantKey]int // local grants not yet observed
	fallbacks int64
	granted   int64

	// The background probe: stopProbe ends the one running (nil when none
	// runs); probes counts the probe goroutines still running, for Close.
	stopProbe context.CancelFunc
	probes    sync.WaitGroup
	closed    bool
}

var _ Store = (*FallbackStore)(nil)

// grantKey identifies a grant by its key and time (the Governor observes a
// request with the time it was granted).
type grantKey struct {
	key string
	at  int64
}

// NewFallbackStore returns a FallbackStore over shared.
func NewFallbackStore(shared Store, opts FallbackOptions) *FallbackStore {
	if opts.Share <= 0 || opts.Share > 1 {
		opts.Share = DefaultFallbackShare
	}
	if opts.Retry <= 0 {
		opts.Retry = DefaultFallbackRetry
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	f := &FallbackStore{
		shared: shared, share: opts.Share, retry: opts.Retry,
		log:     opts.Logger,
		budgets: make(map[string]*Budget), grants: make(map[grantKey]int),
	}
	f.live, f.endLive = context.WithCancel(context.Background())
	return f
}

// Stats returns the store's counts.
func (f *FallbackStore) Stats() FallbackStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return FallbackStats{Fallbacks: f.fallbacks, LocalGrants: f.granted, Local: f.local}
}

// Reserve implements Store. It fails only with ctx's error.
func (f *FallbackStore) Reserve(ctx context.Context, key string, now time.Time, p Policy) (time.Duration, bool, error) {
	if live, ok := f.useShared(now); ok {
		sctx, stop := whileLive(ctx, live)
		wait, ok, err := f.shared.Reserve(sctx, key, now, p)
		stop()
		switch {
		case err == nil:
			f.recovered()
			return wait, ok, nil
		case ctx.Err() != nil:
			f.mu.Lock()
			f.trying = false
			f.mu.Unlock()
			return 0, false, err
		}
		f.failed(key, now, p, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	wait, ok := f.budget(key).Reserve(now, f.scale(p))
	if ok {
		f.grants[grantKey{key, now.UnixNano()}]++
		f.granted++
	}
	return wait, ok, nil
}

// Observe implements Store. It never fails: an observation the shared
// store cannot take is still learned locally.
func (f *FallbackStore) Observe(ctx context.Context, key string, now time.Time, obs Observation, p Policy) error {
	f.mu.Lock()
	g := grantKey{key, obs.Granted.UnixNano()}
	if n := f.grants[g]; n > 0 && !obs.Granted.IsZero() {
		if n == 1 {
			delete(f.grants, g)
		} else {
			f.grants[g] = n - 1
		}
		f.budget(key).Observe(now, f.scaleObs(obs), f.scale(p))
		f.mu.Unlock()
		return nil
	}

	// A request the shared store granted: only it can release the slot.
	// While the store is known to be unreachable, it only releases it
	// locally (the store restates this process's count at its next write)
	// instead of waiting for Redis.
	live := f.live
	f.mu.Unlock()
	sctx, stop := whileLive(ctx, live)
	err := f.shared.Observe(sctx, key, now, obs, p)
	stop()
	switch {
	case err == nil:
		f.recovered()
	case live.Err() == nil:
		f.failed(key, now, p, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.budget(key)
	b.InFlight++ // learn from it without releasing a local slot
	b.Observe(now, f.scaleObs(obs), f.scale(p))
	return nil
}

// LiftPause implements PauseLifter: in the local budget, and in the
// shared store when it lifts pauses and is not known to be unreachable
// (as Reserve asks it; an error of its is returned, the local pause
// lifted all the same).
func (f *FallbackStore) LiftPause(ctx context.Context, key string, now time.Time, p Policy) error {
	f.mu.Lock()
	f.budget(key).LiftPause()
	local := f.local
	live := f.live
	f.mu.Unlock()
	l, ok := f.shared.(PauseLifter)
	if !ok || local {
		return nil
	}
	sctx, stop := whileLive(ctx, live)
	defer stop()
	return l.LiftPause(sctx, key, now, p)
}

// Snapshot implements Store: the shared state, or the local one (scaled)
// while pacing locally. It does not try the shared store while pacing
// locally (a dashboard refreshing would wait on an unreachable Redis each
// time): the background probe switches back within about Retry of Redis
// answering again.
func (f *FallbackStore) Snapshot(ctx context.Context, key string, now time.Time, p Policy) (State, error) {
	f.mu.Lock()
	local := f.local
	f.mu.Unlock()
	if !local {
		if st, err := f.shared.Snapshot(ctx, key, now, p); err == nil {
			return st, nil
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.budget(key).State(now, f.scale(p)), nil
}

// useShared reports whether to ask the shared store: always while it
// answers; while it does not, never while the background probe tries it
// (a request would wait on an unreachable Redis, which can take most of a
// second), else one caller once per Retry. live is done when the shared
// store fails meanwhile (nil for the caller trying it again).
func (f *FallbackStore) useShared(now time.Time) (live context.Context, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.local {
		return f.live, true
	}
	if f.trying || f.stopProbe != nil || now.Before(f.nextTry) {
		return nil, false
	}
	f.trying = true
	return nil, true
}

// whileLive returns ctx, also cancelled when live is done (live nil:
// ctx itself); stop releases it and must be called.
func whileLive(ctx, live context.Context) (_ context.Context, stop func()) {
	if live == nil {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	unhook := context.AfterFunc(live, cancel)
	return ctx, func() {
		unhook()
		cancel()
	}
}

// failed switches to local pacing (or stays there) after a call on key,
// with policy p, failed with err. Switching, it starts the background
// probe, which asks the shared store about key.
func (f *FallbackStore) failed(key string, now time.Time, p Policy, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.trying = false
	f.nextTry = now.Add(f.retry)
	if f.local {
		return
	}
	f.local = true
	f.endLive()
	f.fallbacks++
	f.log.Warn("governor: shared budget unreachable: pacing locally",
		"share", f.share, "retry_every", f.retry.String(), "err", err)
	if !f.closed && f.stopProbe == nil {
		ctx, stop := context.WithCancel(context.Background())
		f.stopProbe = stop
		f.probes.Add(1)
		go f.probe(ctx, key, p)
	}
}

// recovered switches back to the shared store after a call succeeded, and
// ends the background probe.
func (f *FallbackStore) recovered() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.trying = false
	if !f.local {
		return
	}
	f.local = false
	f.live, f.endLive = context.WithCancel(context.Background())
	if f.stopProbe != nil {
		f.stopProbe()
		f.stopProbe = nil
	}
	f.log.Info("governor: shared budget reachable again: pacing through it", "local_grants", f.granted)
}

// probe asks the shared store for key's state every Retry while pacing
// locally, and switches back to it once it answers. It ends then, when ctx
// is done (the switch back was made by a call, or Close), or when the
// shared store's Redis client is closed: it would never answer again.
func (f *FallbackStore) probe(ctx context.Context, key string, p Policy) {
	defer f.probes.Done()
	timer := time.NewTimer(f.retry)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		pctx, cancel := context.WithTimeout(ctx, min(max(f.retry, minProbeTimeout), maxProbeTimeout))
		_, err := f.shared.Snapshot(pctx, key, time.Now(), p)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			f.recovered()
			return
		case errors.Is(err, redis.ErrClosed):
			f.mu.Lock()
			if f.stopProbe != nil && ctx.Err() == nil {
				f.stopProbe()
				f.stopProbe = nil
			}
			f.mu.Unlock()
			f.log.Info("governor: shared budget's Redis client closed: no longer trying it in the background")
			return
		}
		timer.Reset(f.retry)
	}
}

// Close ends the background probe, if one runs, and waits for it, and
// closes the shared store when it is an io.Closer (a RedisStore: its
// renewals of the process's holder entries end; the Redis client stays
// open, the caller owns it). The store stays usable: while pacing locally,
// its calls still try the shared store once per Retry, but nothing does in
// the background any more. Close is idempotent and returns the shared
// store's error.
func (f *FallbackStore) Close() error {
	f.mu.Lock()
	f.closed = true
	if f.stopProbe != nil {
		f.stopProbe()
		f.stopProbe = nil
	}
	f.mu.Unlock()
	f.probes.Wait()
	if c, ok := f.shared.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

func (f *FallbackStore) budget(key string) *Budget {
	b := f.budgets[key]
	if b == nil {
		b = &Budget{}
		f.budgets[key] = b
	}
	return b
}

// scale is p at the fallback share.
func (f *FallbackStore) scale(p Policy) Policy {
	p.Limit = scaleUp(p.Limit, f.share)
	p.Reserve = scaleUp(p.Reserve, f.share)
	return p
}

// scaleObs is obs at the fallback share: this process's part of what the
// platform says.
func (f *FallbackStore) scaleObs(obs Observation) Observation {
	if obs.Limit > 0 {
		obs.Limit = scaleUp(obs.Limit, f.share)
	}
	obs.Remaining = int(math.Floor(float64(obs.Remaining) * f.share))
	return obs
}

// scaleUp is n×share rounded up, at least 1 when n is positive.
func scaleUp(n int, share float64) int {
	if n <= 0 {
		return n
	}
	return max(int(math.Ceil(float64(n)*share)), 1)
}
