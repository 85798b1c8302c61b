// Package governor paces the requests of every API key to the platform so
// that they stay inside the key's rate limit: proactively, by spreading what
// is left of each window until it resets and keeping a reserve back, and
// reactively, by pausing the whole key after a 429.
//
// One Governor serves one API key and is shared by every concurrent request
// of the process (Registry hands them out). The budget lives in a Store:
// MemoryStore for one process; RedisStore for many, sharing one budget per
// key, behind a FallbackStore that paces locally at a share of the budget
// while Redis is unreachable.
package governor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/backstop-sync/backstop"
)

// Defaults applied by New to zero Options fields.
const (
	DefaultLimit       = 30 // the trial tariff, per DefaultWindow
	DefaultWindow      = time.Minute
	DefaultReserve     = 5
	DefaultMaxPause    = 60 * time.Second
	DefaultJitter      = 0.3
	DefaultResetMargin = 100 * time.Millisecond
)

// Clock is the governor's source of time. Tests inject a fake one.
type Clock interface {
	Now() time.Time
	// Sleep waits for d, or returns ctx.Err() as soon as ctx is done.
	Sleep(ctx context.Context, d time.Duration) error
}

// SystemClock returns the real clock.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Options configure a Governor. Zero fields take the defaults above.
type Options struct {
	// Limit requests per Window is the tariff that seeds the budget before
	// the first response (default 30 per minute). The window is replaced by
	// the one learned from successive X-RateLimit-Reset values.
	Limit  int
	Window time.Duration
	// Reserve requests of each window are kept back (default 5; negative
	// for none). It is capped at half the window's limit.
	Reserve int
	// MaxPause caps every 429 pause (default 60s).
	MaxPause time.Duration
	// Jitter is the largest fraction (0..0.3) added to a 429 pause (default
	// 0.3; negative for none).
	Jitter float64
	// ResetMargin is how long past Reset a new window is assumed, for clock
	// skew (default 100ms; negative for none).
	ResetMargin time.Duration
	// Clock defaults to SystemClock(); Rand (in [0, 1)) to math/rand/v2.
	Clock Clock
	Rand  func() float64
	// Store holds the budget (default: a new MemoryStore).
	Store Store
	// Logger receives 429 pauses; it never sees the API key. The lines
	// carry key_id; the caller's logger names the component (the governor
	// adds none, so that JSON lines never hold two).
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.Limit <= 0 {
		o.Limit = DefaultLimit
	}
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	switch {
	case o.Reserve == 0:
		o.Reserve = DefaultReserve
	case o.Reserve < 0:
		o.Reserve = 0
	}
	if o.MaxPause <= 0 {
		o.MaxPause = DefaultMaxPause
	}
	switch {
	case o.Jitter == 0:
		o.Jitter = DefaultJitter
	case o.Jitter < 0:
		o.Jitter = 0
	case o.Jitter > DefaultJitter:
		o.Jitter = DefaultJitter
	}
	switch {
	case o.ResetMargin == 0:
		o.ResetMargin = DefaultResetMargin
	case o.ResetMargin < 0:
		o.ResetMargin = 0
	}
	if o.Clock == nil {
		o.Clock = SystemClock()
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	if o.Store == nil {
		o.Store = NewMemoryStore()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

func (o Options) policy() Policy {
	return Policy{
		Limit:       o.Limit,
		Window:      o.Window,
		Reserve:     o.Reserve,
		MaxPause:    o.MaxPause,
		Jitter:      o.Jitter,
		ResetMargin: o.ResetMargin,
	}
}

// KeyID names an API key without revealing it: the first 16 hex digits of
// its SHA-256. Stores and logs use it in place of the key.
func KeyID(apiKey string) string {
	sum := sha256.Sum256([]byte(apiKey))
	return hex.EncodeToString(sum[:8])
}

// Governor paces the requests of one API key. It is safe for concurrent use;
// every request to the platform with that key should go through it.
type Governor struct {
	key    string // KeyID of the API key
	policy Policy
	clock  Clock
	rand   func() float64
	store  Store
	log    *slog.Logger
}

// New returns the governor of apiKey. Governors of one key share a budget
// only through a shared Store; within a process use a Registry.
func New(apiKey string, opts Options) *Governor {
	opts = opts.withDefaults()
	key := KeyID(apiKey)
	return &Governor{
		key:    key,
		policy: opts.policy(),
		clock:  opts.Clock,
		rand:   opts.Rand,
		store:  opts.Store,
		log:    opts.Logger.With("key_id", key),
	}
}

// KeyID returns the id of the governor's API key (see KeyID).
func (g *Governor) KeyID() string { return g.key }

// Policy returns the pacing configuration the governor applies.
func (g *Governor) Policy() Policy { return g.policy }

// Acquire blocks until one more request may be sent, counts it in flight and
// returns its Ticket, which must end with Done or Abort. It returns ctx.Err()
// when ctx ends first, or the Store's error.
func (g *Governor) Acquire(ctx context.Context) (*Ticket, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	start := g.clock.Now()
	askedAgain := false
	for {
		now := g.clock.Now()
		wait, granted, err := g.store.Reserve(ctx, g.key, now, g.policy)
		if err != nil {
			return nil, fmt.Errorf("governor: reserve: %w", err)
		}
		if granted {
			return &Ticket{g: g, ctx: context.WithoutCancel(ctx), waited: now.Sub(start), granted: now}, nil
		}
		// A long wait for a 429's pause is asked again now and then, so
		// that a pause lifted meanwhile (LiftPause, here or in another
		// process sharing the store) lets the request go. A long wait
		// with no pause to be seen is asked again once at once (the
		// pause it waited for may have been lifted since the Reserve),
		// then, the budget's next window, slept whole.
		if wait > pauseRecheck {
			switch {
			case g.paused(ctx, now):
				wait, askedAgain = pauseRecheck, false
			case !askedAgain:
				askedAgain = true
				continue
			}
		} else {
			askedAgain = false
		}
		if err := g.clock.Sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// paused reports whether the key is in a 429's pause at now (true when
// the store cannot tell: the wait is then asked again).
func (g *Governor) paused(ctx context.Context, now time.Time) bool {
	st, err := g.store.Snapshot(ctx, g.key, now, g.policy)
	return err != nil || st.PausedUntil.After(now)
}

// pauseRecheck is the longest Acquire sleeps in a 429's pause before it
// asks the store again.
const pauseRecheck = 2 * time.Second

// LiftPause ends the key's 429 pause now, for every process sharing its
// store, when the store can (PauseLifter; it does nothing otherwise).
// Requests waiting in Acquire go within pauseRecheck.
func (g *Governor) LiftPause(ctx context.Context) error {
	l, ok := g.store.(PauseLifter)
	if !ok {
		return nil
	}
	if err := l.LiftPause(ctx, g.key, g.clock.Now(), g.policy); err != nil {
		return fmt.Errorf("governor: lift pause: %w", err)
	}
	return nil
}

// State returns the key's budget as the governor sees it now.
func (g *Governor) State(ctx context.Context) (State, error) {
	st, err := g.store.Snapshot(ctx, g.key, g.clock.Now(), g.policy)
	if err != nil {
		return State{}, fmt.Errorf("governor: state: %w", err)
	}
	return st, nil
}

// Ticket is one granted request. Exactly one of Done and Abort takes effect;
// later calls do nothing.
type Ticket struct {
	g       *Governor
	ctx     context.Context // Acquire's values, without its cancellation
	waited  time.Duration
	granted time.Time
	ended   atomic.Bool
}

// Waited returns how long Acquire waited on the budget for this request.
func (t *Ticket) Waited() time.Duration { return t.waited }

// Done reports the response to the request: the budget learns from its
// X-RateLimit-Limit, -Remaining and -Reset headers, and a 429 pauses the
// whole key until Retry-After (with doubling, jitter and the MaxPause cap).
// It releases the request's in-flight slot.
func (t *Ticket) Done(status int, h http.Header) {
	if !t.ended.CompareAndSwap(false, true) {
		return
	}
	g := t.g
	now := g.clock.Now()
	obs := parseHeaders(h, now)
	obs.Status = status
	obs.Granted = t.granted
	if status == http.StatusTooManyRequests {
		obs.RetryAfter, obs.HasRetryAfter = backstop.RetryAfterIn(h, now)
		obs.Rand = g.rand()
	}
	if err := g.store.Observe(t.ctx, g.key, now, obs, g.policy); err != nil {
		g.log.Warn("governor: observe", "err", err)
		return
	}
	if status == http.StatusTooManyRequests {
		if st, err := g.store.Snapshot(t.ctx, g.key, now, g.policy); err == nil {
			g.log.Info("rate limited: key paused",
				"paused_for", st.PausedUntil.Sub(now).Round(time.Millisecond).String(), "consecutive_429", st.Consecutive429,
				"retry_after", h.Get("Retry-After"))
		}
	}
}

// Abort reports that the request got no response (network error, cancelled
// context). It releases the request's in-flight slot and counts the request
// as spent, since the platform may have counted it.
func (t *Ticket) Abort() {
	if !t.ended.CompareAndSwap(false, true) {
		return
	}
	g := t.g
	obs := Observation{Aborted: true, Granted: t.granted}
	if err := g.store.Observe(t.ctx, g.key, g.clock.Now(), obs, g.policy); err != nil {
		g.log.Warn("governor: observe", "err", err)
	}
}

// maxResetAhead is the furthest off a window's reset is believed: a
// monthly quota's.
const maxResetAhead = 32 * 24 * time.Hour

// resetBelievable tells whether a window ending at reset, read at now, can
// be the current one. One that has already ended, or that ends further
// off than any quota's, says nothing of it: taken at its word it would
// refill the budget at once (Remaining: 0 and all: a 429 storm), or hold
// the key for years. The answer is then read as one without headers.
func resetBelievable(reset, now time.Time) bool {
	return reset.After(now) && reset.Sub(now) <= maxResetAhead
}

// parseHeaders reads X-RateLimit-Limit, -Remaining and -Reset, or Discord's
// -Reset-After (seconds until the reset). Reset is Unix seconds (fractions
// allowed); a value too small to be a date (under ten years of seconds) is
// read as seconds from now, as some platforms send. A Unix time is the
// platform's clock, so it is measured from the answer's Date header when
// the local clock is found apart from it (backstop.ServerClock): a local
// clock minutes ahead would otherwise take the window for over and spend
// the next one's budget into 429s, and one minutes behind would wait
// minutes for a reset long past.
func parseHeaders(h http.Header, now time.Time) Observation {
	var obs Observation
	rem, err1 := strconv.Atoi(strings.TrimSpace(h.Get("X-RateLimit-Remaining")))
	reset, err2 := strconv.ParseFloat(strings.TrimSpace(h.Get("X-RateLimit-Reset")), 64)
	after, err3 := strconv.ParseFloat(strings.TrimSpace(h.Get("X-RateLimit-Reset-After")), 64)
	if err1 != nil || rem < 0 {
		return obs
	}
	switch {
	case err3 == nil && after >= 0 && after < 1e9:
		// Discord's form: seconds until the bucket resets (more precise
		// than its X-RateLimit-Reset, so preferred).
		obs.HasBudget, obs.Remaining = true, rem
		obs.Reset = now.Add(time.Duration(after * float64(time.Second)))
	case err2 != nil || math.IsNaN(reset) || reset < 0 || reset > 1e11:
		return obs
	}
	if obs.HasBudget {
		if !resetBelievable(obs.Reset, now) {
			return Observation{}
		}
		if l, err := strconv.Atoi(strings.TrimSpace(h.Get("X-RateLimit-Limit"))); err == nil && l > 0 {
			obs.Limit = l
		}
		return obs
	}
	obs.HasBudget = true
	obs.Remaining = rem
	if reset < 10*365*24*3600 {
		obs.Reset = now.Add(time.Duration(reset * float64(time.Second)))
	} else {
		sec := int64(reset)
		at := time.Unix(sec, int64((reset-float64(sec))*1e9))
		obs.Reset = now.Add(at.Sub(backstop.ServerClock(h, now)))
		obs.ResetRaw = reset
	}
	if !resetBelievable(obs.Reset, now) {
		return Observation{}
	}
	if l, err := strconv.Atoi(strings.TrimSpace(h.Get("X-RateLimit-Limit"))); err == nil && l > 0 {
		obs.Limit = l
	}
	return obs
}

// Registry hands out one Governor per API key, all sharing one Store. It is
// safe for concurrent use.
type Registry struct {
	opts Options
	mu   sync.Mutex
	govs map[string]*Governor
}

// NewRegistry returns a registry whose governors use opts; when opts.Store is
// nil they share one new MemoryStore.
func NewRegistry(opts Options) *Registry {
	if opts.Store == nil {
		opts.Store = NewMemoryStore()
	}
	return &Registry{opts: opts, govs: make(map[string]*Governor)}
}

// Get returns the governor of apiKey, the same one on every call.
func (r *Registry) Get(apiKey string) *Governor {
	id := KeyID(apiKey)
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.govs[id]
	if g == nil {
		g = New(apiKey, r.opts)
		r.govs[id] = g
	}
	return g
}
