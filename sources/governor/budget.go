package governor

import (
	"time"
)

// probeRecheck is how often a request re-decides while the first request of
// a key (the probe that learns the real budget) is still in flight.
const probeRecheck = 50 * time.Millisecond

// basePause is the 429 pause used when Retry-After is absent or unreadable.
const basePause = time.Second

// Policy is the pacing configuration a Store applies. It travels with every
// Store call, so a shared store (Redis) needs no configuration of its own and
// processes with different settings still agree on the budget they share.
type Policy struct {
	// Limit and Window are the tariff that seeds a key before its first
	// response, e.g. 30 per minute.
	Limit  int
	Window time.Duration
	// Reserve is how many requests of a window are kept back. It is capped
	// at half the window's limit so that a small limit still sends.
	Reserve int
	// MaxPause caps every 429 pause.
	MaxPause time.Duration
	// Jitter is the largest fraction added to a 429 pause (0..1).
	Jitter float64
	// ResetMargin is how long past Reset a new window is assumed, to absorb
	// clock skew between this host and the platform.
	ResetMargin time.Duration
}

// Budget is the rate-limit state of one API key: what the platform last said
// about the window, what this process (or every process sharing the store)
// has in flight, and the 429 pause. Its methods are the whole pacing
// algorithm; a Store only has to run them atomically. Budget has exported
// fields so that a shared store can persist it: RedisStore keeps it as JSON
// and swaps it with a version check, running these same methods.
//
// The zero Budget is a key never seen: it is seeded from the Policy.
type Budget struct {
	// Limit and Remaining are the window's size and what is left of it, as
	// last reported by X-RateLimit-Limit/Remaining (or assumed: seeded from
	// the tariff, or refilled when a window ended without news, and counted
	// down by the answers of a server that sends no such headers).
	Limit     int
	Remaining int
	// Reset is when the current window ends (observed or assumed).
	Reset time.Time
	// Observed is the latest X-RateLimit-Reset seen in a response; zero
	// before the first response. Reset after Observed means the current
	// window is assumed, not yet confirmed by a response.
	Observed time.Time
	// ObservedRaw is Observed as the platform wrote it (Unix seconds on
	// its clock), when it wrote a time rather than seconds from now: the
	// window's name, which its answers repeat exactly while Observed, read
	// through their Date headers, wanders by up to a second.
	ObservedRaw float64 `json:",omitzero"`
	// Window is the window length learned from successive Reset values;
	// zero until learned (Policy.Window is used meanwhile).
	Window time.Duration
	// InFlight counts requests granted and not yet answered or aborted.
	InFlight int
	// LastGrant is when the last request was granted in the current window.
	LastGrant time.Time
	// PausedUntil is the end of the current 429 pause.
	PausedUntil time.Time
	// Consecutive429 counts 429 answers since the last non-429 answer,
	// counting a burst of 429s to requests that were in flight together once.
	Consecutive429 int
	// PauseStart is when the latest 429 burst began.
	PauseStart time.Time
	// Answered is when the server first answered (below 500) without
	// rate-limit headers: it does not publish its budget, so the seeded one
	// is all there is to know, and requests need not wait one at a time
	// for a response that will never say more (a delivery target without
	// X-RateLimit-*). Until a server sends headers, each of its answers is
	// counted against Remaining here.
	Answered time.Time `json:",omitzero"`
}

// Observation is what one finished request tells the budget. Every granted
// request ends in exactly one Observation, which releases its in-flight slot.
type Observation struct {
	// Status is the HTTP status, 0 when no response arrived (network error,
	// cancelled context).
	Status int
	// HasBudget reports that X-RateLimit-Remaining and X-RateLimit-Reset
	// were present and readable; Limit is 0 when X-RateLimit-Limit was not.
	HasBudget bool
	Limit     int
	Remaining int
	Reset     time.Time
	// ResetRaw is X-RateLimit-Reset as sent, when it is a Unix time (0 for
	// seconds from now): answers of one window carry the same.
	ResetRaw float64
	// RetryAfter is the parsed Retry-After of a 429; HasRetryAfter is false
	// when the header was absent or unreadable.
	RetryAfter    time.Duration
	HasRetryAfter bool
	// Rand is a sample in [0, 1) that scales the jitter of a 429 pause. It is
	// drawn by the caller so that stores stay deterministic.
	Rand float64
	// Granted is when the request was granted (zero when unknown). A 429 to
	// a request granted before the current pause began belongs to the same
	// burst: it may lengthen the pause but does not count as consecutive.
	Granted time.Time
	// Aborted marks a request that got no response: the platform may well
	// have counted it, so it is taken as spent.
	Aborted bool
}

// State is a read-only view of a key's budget for the CLI and dashboard.
type State struct {
	Limit          int
	Remaining      int
	Reset          time.Time
	Window         time.Duration
	InFlight       int
	PausedUntil    time.Time
	Consecutive429 int
	// Learned reports whether any response has been observed; before it the
	// numbers are the seeded tariff.
	Learned bool
}

// Reserve decides, at now, whether one more request may be sent. When it may,
// the request is counted in flight and granted is true; otherwise wait is how
// long to sleep before deciding again (the state may change meanwhile).
func (b *Budget) Reserve(now time.Time, p Policy) (wait time.Duration, granted bool) {
	b.roll(now, p)
	if wait := decide(*b, now, p); wait > 0 {
		return wait, false
	}
	b.InFlight++
	b.LastGrant = now
	return 0, true
}

// LiftPause ends the budget's 429 pause at once and forgets the 429s that
// made it (an operator said the limit is over: backstop deliveries
// targets enable).
func (b *Budget) LiftPause() {
	b.PausedUntil, b.PauseStart, b.Consecutive429 = time.Time{}, time.Time{}, 0
}

// Observe applies one finished request at now: it releases the in-flight
// slot, learns the window from the rate-limit headers and, on a 429, pauses
// the key.
//
// A Reset later than any seen starts a new window and takes its values; the
// same Reset keeps the lower Remaining (responses arrive out of order); an
// older Reset, or the Reset of a window already assumed over, is ignored.
func (b *Budget) Observe(now time.Time, obs Observation, p Policy) {
	if b.InFlight > 0 {
		b.InFlight--
	}
	b.roll(now, p)
	if obs.HasBudget {
		b.observeHeaders(obs, p)
	} else if b.Observed.IsZero() && !obs.Aborted {
		b.answeredWithoutHeaders(now, obs, p)
	}
	switch {
	case obs.Aborted:
		if b.Remaining > 0 {
			b.Remaining--
		}
	case obs.Status == 429:
		sameBurst := !obs.Granted.IsZero() && !b.PauseStart.IsZero() && obs.Granted.Before(b.PauseStart)
		consecutive := b.Consecutive429
		if sameBurst && consecutive > 0 {
			consecutive--
		}
		d := pauseFor(obs.RetryAfter, obs.HasRetryAfter, consecutive, p, obs.Rand)
		if until := now.Add(d); until.After(b.PausedUntil) {
			b.PausedUntil = until
		}
		if !sameBurst {
			b.Consecutive429++
			b.PauseStart = now
		}
	case obs.Status > 0 && obs.Status < 500:
		b.Consecutive429 = 0
	}
}

// answeredWithoutHeaders applies an answer without rate-limit headers from
// a server that has never sent any (a delivery target without
// X-RateLimit-*). Its seeded budget is all there is to know, so the
// one-at-a-time probe ends, and this process is the only one counting: the
// answer spends one request of the window it was granted in, as an abort
// does. A request granted in a window already over was counted there (in
// flight) and is not counted again. Once a server has sent headers, their
// count stands and an answer without them only releases its slot.
func (b *Budget) answeredWithoutHeaders(now time.Time, obs Observation, p Policy) {
	if b.Answered.IsZero() && obs.Status > 0 && obs.Status < 500 {
		b.Answered = now
	}
	start := b.Reset.Add(-b.window(p))
	if b.Remaining > 0 && (obs.Granted.IsZero() || !obs.Granted.Before(start)) {
		b.Remaining--
	}
}

// State returns the view of b at now, with a window that ended assumed over.
func (b Budget) State(now time.Time, p Policy) State {
	b.roll(now, p)
	return State{
		Limit:          b.Limit,
		Remaining:      b.Remaining,
		Reset:          b.Reset,
		Window:         b.window(p),
		InFlight:       b.InFlight,
		PausedUntil:    b.PausedUntil,
		Consecutive429: b.Consecutive429,
		Learned:        !b.Observed.IsZero(),
	}
}

func (b *Budget) observeHeaders(obs Observation, p Policy) {
	r := obs.Reset
	named := obs.ResetRaw > 0 && b.ObservedRaw > 0 && !b.Observed.IsZero()
	switch {
	case named:
		// Windows named by the platform's own clock are told apart, and
		// ordered, by their names: their times here, read through Date
		// headers of a clock apart from this one, wander by up to a
		// second (its resolution and the answer's way here).
		// (Within ResetMargin they are one window, for a platform whose
		// fractional resets move a little with every answer.)
		switch d := time.Duration((obs.ResetRaw - b.ObservedRaw) * float64(time.Second)); {
		case d > -p.ResetMargin && d < p.ResetMargin:
			r = b.Observed
		case d < 0:
			return // an older window: stale news
		default:
			r = b.Observed.Add(d)
		}
	case !b.Observed.IsZero() && p.ResetMargin > 0:
		// A reset given relative to the answer (X-RateLimit-Reset-After,
		// or a small X-RateLimit-Reset) moves a little with every answer;
		// within ResetMargin of the window known it is that window, not a
		// new one.
		if d := r.Sub(b.Observed); d > -p.ResetMargin && d < p.ResetMargin {
			r = b.Observed
		}
	}
	switch {
	case b.Observed.IsZero() || r.After(b.Observed):
		if !b.Observed.IsZero() {
			if d := r.Sub(b.Observed); b.Window == 0 || d < b.Window {
				b.Window = d
			}
		}
		b.ObservedRaw = obs.ResetRaw
		switch {
		case r.Equal(b.Reset):
			// The window this process assumed is confirmed.
			b.Remaining = min(b.Remaining, obs.Remaining)
		case r.After(b.Reset):
			// The platform is in a window this process did not expect yet.
			b.Remaining = obs.Remaining
			b.LastGrant = time.Time{}
		default:
			// The assumed window was too long (the seed or learned window
			// overshot); the platform's word wins.
			b.Remaining = obs.Remaining
		}
		b.Reset = r
		b.Observed = r
	case r.Equal(b.Observed) && !b.Reset.After(b.Observed):
		b.Remaining = min(b.Remaining, obs.Remaining)
	default:
		return // an older window, or one assumed over: stale news
	}
	if obs.Limit > 0 {
		b.Limit = obs.Limit
	}
}

// roll seeds a new key and, once now is ResetMargin past Reset with no newer
// observation, assumes a fresh window: Remaining = Limit, Reset advanced by
// whole windows.
func (b *Budget) roll(now time.Time, p Policy) {
	if b.Reset.IsZero() {
		b.Limit = p.Limit
		b.Remaining = p.Limit
		b.Reset = now.Add(p.Window)
		return
	}
	end := b.Reset.Add(p.ResetMargin)
	if now.Before(end) {
		return
	}
	w := b.window(p)
	n := now.Sub(end)/w + 1
	b.Reset = b.Reset.Add(n * w)
	b.Remaining = b.Limit
	b.LastGrant = time.Time{}
}

func (b Budget) window(p Policy) time.Duration {
	switch {
	case b.Window > 0:
		return b.Window
	case p.Window > 0:
		return p.Window
	}
	return time.Minute
}

// decide is the pacing rule: how long to wait at now before the next request
// may be granted (0: grant now). b must already be rolled to now.
//
//   - during a 429 pause: until the pause ends;
//   - available = Remaining − InFlight − reserve; at or below zero: until
//     Reset + ResetMargin;
//   - while the budget is a guess, one probe request at a time: before the
//     first response (the seed may overstate what is left of a window another
//     process already used), and in a window assumed with a length not yet
//     learned (its Reset may be far off the platform's);
//   - otherwise the available budget is spread evenly until Reset: the next
//     grant is not before LastGrant + (Reset − now)/available.
func decide(b Budget, now time.Time, p Policy) time.Duration {
	if now.Before(b.PausedUntil) {
		return b.PausedUntil.Sub(now)
	}
	avail := b.Remaining - b.InFlight - reserveFor(b.Limit, p)
	if avail <= 0 {
		return b.Reset.Add(p.ResetMargin).Sub(now)
	}
	if b.InFlight > 0 && b.unconfirmed() {
		return probeRecheck
	}
	if b.LastGrant.IsZero() {
		return 0
	}
	interval := b.Reset.Sub(now) / time.Duration(avail)
	return max(b.LastGrant.Add(interval).Sub(now), 0)
}

// unconfirmed reports whether the budget is a guess that one response would
// correct: no response seen yet, or a window assumed without a learned
// length. A server that answered without rate-limit headers has nothing to
// correct it with: its seeded budget stands.
func (b Budget) unconfirmed() bool {
	if b.Observed.IsZero() {
		return b.Answered.IsZero()
	}
	return b.Window == 0 && b.Reset.After(b.Observed)
}

func reserveFor(limit int, p Policy) int {
	return max(min(p.Reserve, limit/2), 0)
}

// pauseFor is the 429 pause: Retry-After (basePause when absent or
// unreadable, and at least basePause after the first), doubled for each earlier consecutive 429, plus jitter of
// r·Jitter of itself, capped at MaxPause.
func pauseFor(retryAfter time.Duration, ok bool, consecutive int, p Policy, r float64) time.Duration {
	d := basePause
	if ok {
		d = max(retryAfter, 0)
	}
	if consecutive > 0 {
		// "Retry now" (0, or a date already past) is honoured once; a 429
		// again right after it waits at least the base pause, doubling, so
		// a platform that sends no usable Retry-After gets no 429 storm.
		d = max(d, basePause)
	}
	for i := 0; i < consecutive && d < p.MaxPause; i++ {
		d *= 2
	}
	if d >= p.MaxPause {
		return p.MaxPause
	}
	d += time.Duration(float64(d) * p.Jitter * min(max(r, 0), 1))
	return min(d, p.MaxPause)
}
