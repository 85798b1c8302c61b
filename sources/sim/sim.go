// Package sim is an in-memory simulator of the platform's public API. It
// serves the whole API contract of DESIGN.md (Bearer auth, cursor-paginated
// change feeds with since, single-object reads, X-RateLimit-* headers, 429
// with Retry-After in every form) over deterministic seed data, and can
// inject 5xx errors, latency and a stream of mutations, so that the client,
// the governor and the engine can be tested end to end without the network.
// Given a WebhookURL it also announces every mutation with a signed webhook
// (the botix scheme), losing, duplicating, reordering and retrying them as
// the platform does; see StartWebhooks.
//
// Seed data starts at BaseTime. Within each resource about 30% of objects
// share the previous object's updated_at, so runs of equal timestamps
// straddle page boundaries. Names and texts mix Cyrillic, Polish diacritics,
// CJK and emoji; a few messages are larger than 64 KiB.
package sim

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/backstop-sync/backstop"
)

// Defaults applied by New to zero Options fields.
const (
	DefaultAPIKey     = "sim_test_key"
	DefaultObjects    = 1000
	DefaultBigObjects = 3
	DefaultWindow     = 60 * time.Second
)

// Bounds that Validate enforces.
const (
	// MaxObjects bounds Objects: the simulator holds every object in
	// memory and makes them all before it serves.
	MaxObjects = 1_000_000
	// MaxMutationRate bounds MutationRate, changes per second: a change
	// holds the simulator's lock, and at a billion a second one tick's
	// changes would take minutes and no Ctrl-C would end them.
	MaxMutationRate = 100_000
)

// UnlimitedLimit is what X-RateLimit-Limit reports when Options.Limit is 0
// (no limit): a budget so large that a client's governor never throttles.
// X-RateLimit-Remaining then counts down from it within each window.
const UnlimitedLimit = 1_000_000_000

// The accepted values of Options.RetryAfter.
const (
	RetryAfterSeconds = "seconds" // delta seconds, e.g. "17"
	RetryAfterDate    = "date"    // IMF-fixdate, e.g. "Sun, 06 Nov 1994 08:49:37 GMT"
	RetryAfterRFC850  = "rfc850"  // obsolete RFC 850 date, e.g. "Sunday, 06-Nov-94 08:49:37 GMT"
	RetryAfterAsctime = "asctime" // obsolete asctime date, e.g. "Sun Nov  6 08:49:37 1994"
	// RetryAfterMixed cycles through seconds, IMF-fixdate, RFC 850 and
	// asctime, one form per 429 answered, starting with seconds.
	RetryAfterMixed = "mixed"
)

// BaseTime is the updated_at before the first seed object of every resource.
// Seed data spans at most 30 days after it.
var BaseTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Options configure a Sim. The zero value is a usable simulator with 1000
// objects per resource, no rate limit, no errors and no latency.
type Options struct {
	// Seed makes the data deterministic: the same Seed and Objects give the
	// same objects, and the same sequence of Mutate calls gives the same
	// mutations (their timestamps follow Now).
	Seed int64
	// Objects is the number of objects per resource at start: 0 means
	// DefaultObjects, a negative value means none.
	Objects int
	// APIKey is the only key accepted; "" means DefaultAPIKey.
	APIKey string
	// Limit is the number of requests per fixed window per API key; 0 means
	// unlimited (see UnlimitedLimit).
	Limit int
	// Window is the fixed rate-limit window, rounded up to whole seconds;
	// 0 means DefaultWindow. Windows are aligned to multiples of Window since
	// the Unix epoch, so X-RateLimit-Reset is exact.
	Window time.Duration
	// RetryAfter is the form of the Retry-After header of a 429: one of the
	// RetryAfter* constants; "" means RetryAfterSeconds.
	RetryAfter string
	// ErrorRate is the fraction (0..1) of authorised requests within the
	// limit that are answered with a random 500, 502 or 503.
	ErrorRate float64
	// Latency is added to every response.
	Latency time.Duration
	// MutationRate is the number of mutations per second Run makes; 0 means
	// none.
	MutationRate float64
	// BigObjects is the number of seed messages whose JSON exceeds 64 KiB
	// (long texts; other resources have no big objects): 0 means
	// DefaultBigObjects, a negative value means none. It is capped at the
	// number of messages.
	BigObjects int
	// Now is the clock for timestamps of mutations, of webhook attempts and
	// for rate-limit windows; nil means time.Now.
	Now func() time.Time

	// WebhookURL is where every mutation is announced by a signed webhook
	// (see StartWebhooks); "" means no webhooks are made.
	WebhookURL string
	// WebhookSecret is the key of the X-Botix-Signature HMAC; "" signs with
	// an empty key.
	WebhookSecret string
	// DropRate is the fraction (0..1) of events the platform loses: never
	// sent, not even retried.
	DropRate float64
	// DuplicateRate is the fraction (0..1) of the events not dropped that
	// are delivered twice, as two separate deliveries with the same
	// event_id, each retried on its own.
	DuplicateRate float64
	// ReorderRate is the fraction (0..1) of the events not dropped that are
	// held back until 1 to MaxReorderDelay later events (neither dropped
	// nor held back themselves) have been queued, or until WebhooksIdle is
	// called, so they arrive after newer ones.
	ReorderRate float64
	// RetrySchedule is the wait before each retry of a delivery answered
	// with a non-2xx status or failed in transport; after the last the
	// platform gives up. nil means DefaultRetrySchedule(); an empty non-nil
	// slice means no retries.
	RetrySchedule []time.Duration
	// WebhookWorkers is the number of concurrent senders; 0 means
	// DefaultWebhookWorkers.
	WebhookWorkers int
	// WebhookTimeout bounds one delivery attempt; 0 means
	// DefaultWebhookTimeout.
	WebhookTimeout time.Duration
	// Logger, when set, is told of webhook attempts that were not
	// answered 2xx (a wrong URL, a secret the receiver does not share):
	// the first at once, then at most one line per WebhookWarnEvery with
	// how many failed meanwhile. Nil logs nothing.
	Logger *slog.Logger
	// TruncateOver is the largest webhook body, in bytes, sent whole; an
	// event whose body would be larger carries only the object's id,
	// "data":{"id":"…"}, with "truncated":true. 0 means
	// DefaultTruncateOver (64 KiB, the intake's body limit).
	TruncateOver int
}

// Validate reports the first option out of range.
func (o Options) Validate() error {
	switch o.RetryAfter {
	case "", RetryAfterSeconds, RetryAfterDate, RetryAfterRFC850, RetryAfterAsctime, RetryAfterMixed:
	default:
		return fmt.Errorf("sim: retry-after form %q: want seconds, date, rfc850, asctime or mixed", o.RetryAfter)
	}
	switch {
	case o.Limit < 0:
		return fmt.Errorf("sim: limit %d: must not be negative", o.Limit)
	case o.Window < 0:
		return fmt.Errorf("sim: window %s: must not be negative", o.Window)
	case !(o.ErrorRate >= 0 && o.ErrorRate <= 1): // NaN too
		return fmt.Errorf("sim: error rate %g: want 0..1", o.ErrorRate)
	case o.Latency < 0:
		return fmt.Errorf("sim: latency %s: must not be negative", o.Latency)
	case !(o.MutationRate >= 0 && o.MutationRate <= MaxMutationRate): // NaN too
		return fmt.Errorf("sim: mutation rate %g: want 0..%d changes per second", o.MutationRate, MaxMutationRate)
	case o.Objects > MaxObjects:
		return fmt.Errorf("sim: objects %d: want at most %d per resource", o.Objects, MaxObjects)
	}
	return o.validateWebhooks()
}

// Stats counts what a Sim has answered.
type Stats struct {
	Requests     int // requests received with a valid key (429s and injected errors included)
	RateLimited  int // 429s answered
	Errors       int // injected 5xx answered
	Unauthorized int // 401s answered
	// Windows has one entry per fixed window that saw authorised traffic,
	// in time order.
	Windows []WindowStat
}

// WindowStat counts one fixed rate-limit window.
type WindowStat struct {
	Start       time.Time
	Length      time.Duration
	Requests    int // requests counted against the limit (429s excluded)
	RateLimited int // 429s answered in the window
}

// Sim is an in-memory platform. It is safe for concurrent use: requests,
// Mutate and the setters may run at the same time.
type Sim struct {
	apiKey      string
	now         func() time.Time
	latency     time.Duration
	mutRate     float64
	retryAfterF string

	mu    sync.RWMutex // guards the data below
	feeds map[backstop.Resource]*feed
	gen   *generator
	cgen  uint64    // cursor generation, bumped by InvalidateCursors
	last  int64     // greatest updated_at in the sim, Unix nanoseconds
	wh    *webhooks // nil when Options.WebhookURL is ""

	rl        sync.Mutex // guards the rate limiter, error injection and stats
	limit     int
	window    int64 // seconds
	errorRate float64
	errRng    *rand.Rand
	n429      int
	stats     Stats
	winIdx    map[windowKey]int // index into stats.Windows
}

type windowKey struct{ start, length int64 }

// New returns a Sim holding the seed data. It panics when opts.Validate
// fails; callers taking options from users validate them first.
func New(opts Options) *Sim {
	if err := opts.Validate(); err != nil {
		panic(err)
	}
	s := &Sim{
		apiKey:      opts.APIKey,
		now:         opts.Now,
		latency:     opts.Latency,
		mutRate:     opts.MutationRate,
		retryAfterF: opts.RetryAfter,
		feeds:       make(map[backstop.Resource]*feed, len(backstop.Resources)),
		limit:       opts.Limit,
		window:      windowSeconds(opts.Window),
		errorRate:   opts.ErrorRate,
		errRng:      rand.New(rand.NewPCG(uint64(opts.Seed), 0x6572726f72)),
		winIdx:      make(map[windowKey]int),
	}
	if opts.WebhookURL != "" {
		s.wh = newWebhooks(opts)
	}
	if s.apiKey == "" {
		s.apiKey = DefaultAPIKey
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.wh != nil {
		s.wh.now = s.now
	}
	if s.retryAfterF == "" {
		s.retryAfterF = RetryAfterSeconds
	}
	n := opts.Objects
	switch {
	case n == 0:
		n = DefaultObjects
	case n < 0:
		n = 0
	}
	big := opts.BigObjects
	switch {
	case big == 0:
		big = DefaultBigObjects
	case big < 0:
		big = 0
	}
	s.gen = newGenerator(opts.Seed)
	for _, r := range backstop.Resources {
		recs := s.gen.seed(r, n, big)
		f := newFeed(recs)
		s.feeds[r] = f
		if len(recs) > 0 {
			s.last = max(s.last, recs[len(recs)-1].ts)
		}
	}
	return s
}

func windowSeconds(d time.Duration) int64 {
	if d <= 0 {
		d = DefaultWindow
	}
	return int64((d + time.Second - 1) / time.Second)
}

// APIKey returns the key the Sim accepts.
func (s *Sim) APIKey() string { return s.apiKey }

// SetErrorRate changes the fraction of requests answered with an injected
// 5xx; f is clamped to 0..1.
func (s *Sim) SetErrorRate(f float64) {
	s.rl.Lock()
	defer s.rl.Unlock()
	s.errorRate = min(max(f, 0), 1)
}

// SetLimit changes the rate limit (0 = unlimited) and the window length
// (0 = DefaultWindow). Requests already counted in the current window still
// count when the length is unchanged.
func (s *Sim) SetLimit(limit int, window time.Duration) {
	s.rl.Lock()
	defer s.rl.Unlock()
	s.limit = max(limit, 0)
	s.window = windowSeconds(window)
}

// InvalidateCursors makes every cursor issued so far answer 400
// invalid_cursor, as a platform does after losing its cursor state.
func (s *Sim) InvalidateCursors() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cgen++
}

// Stats returns a snapshot of the counters.
func (s *Sim) Stats() Stats {
	s.rl.Lock()
	defer s.rl.Unlock()
	st := s.stats
	st.Windows = append([]WindowStat(nil), s.stats.Windows...)
	sort.SliceStable(st.Windows, func(i, j int) bool { return st.Windows[i].Start.Before(st.Windows[j].Start) })
	return st
}

// Objects returns the current version of every object of r in feed order
// (updated_at, id). Data is the exact JSON the API serves; it is shared with
// the Sim and must not be modified.
func (s *Sim) Objects(r backstop.Resource) []backstop.Object {
	s.mu.RLock()
	defer s.mu.RUnlock()
	f := s.feeds[r]
	if f == nil {
		return nil
	}
	out := make([]backstop.Object, len(f.recs))
	for i, rec := range f.recs {
		out[i] = rec.object(r)
	}
	return out
}

// Object returns the current version of the object of r with the given id.
// Data is shared with the Sim and must not be modified.
func (s *Sim) Object(r backstop.Resource, id string) (backstop.Object, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	f := s.feeds[r]
	if f == nil {
		return backstop.Object{}, false
	}
	rec, ok := f.byID[id]
	if !ok {
		return backstop.Object{}, false
	}
	return rec.object(r), true
}

// Len returns the number of objects of r.
func (s *Sim) Len(r backstop.Resource) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if f := s.feeds[r]; f != nil {
		return len(f.recs)
	}
	return 0
}

// Mutate makes n mutations now, a deterministic (from the seed) mix of
// creates and updates across resources, and returns the new versions in the
// order they were made. Each new updated_at is later than every updated_at
// in the Sim so far: Now truncated to microseconds, or one microsecond after
// the latest if Now is not later. An updated object moves to the end of its
// feed. With a WebhookURL, each mutation queues one webhook event (see
// StartWebhooks).
func (s *Sim) Mutate(n int) []backstop.Object {
	if n <= 0 {
		return nil
	}
	out := make([]backstop.Object, 0, n)
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		r, rec := s.gen.mutate(s.feeds, s.nextTS())
		out = append(out, s.store(r, rec))
	}
	return out
}

// Update makes the next version of the object of r with the given id now,
// as Mutate would, and returns it. It reports false when there is no such
// object or it cannot change (a payment already failed or refunded). With a
// WebhookURL the update queues a webhook event. It draws from the same
// seeded source as Mutate, so it changes what later Mutate calls make.
func (s *Sim) Update(r backstop.Resource, id string) (backstop.Object, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.feeds[r]
	if f == nil {
		return backstop.Object{}, false
	}
	old, ok := f.byID[id]
	if !ok {
		return backstop.Object{}, false
	}
	rec := s.gen.update(old, s.nextTS())
	if rec == nil {
		return backstop.Object{}, false
	}
	return s.store(r, rec), true
}

// nextTS returns the updated_at of the next mutation. The caller holds mu.
func (s *Sim) nextTS() int64 {
	return max(s.now().UTC().Truncate(time.Microsecond).UnixNano(), s.last+int64(time.Microsecond))
}

// store puts a new version into its feed and queues its webhook event. The
// caller holds mu, which also orders the events as the versions were made.
func (s *Sim) store(r backstop.Resource, rec *record) backstop.Object {
	f := s.feeds[r]
	_, existed := f.byID[rec.id]
	f.put(rec)
	s.last = rec.ts
	if s.wh != nil {
		s.wh.event(r, rec, !existed)
	}
	return rec.object(r)
}

// errInvalidCursor is returned for a cursor the Sim cannot read.
var errInvalidCursor = errors.New("invalid cursor")
