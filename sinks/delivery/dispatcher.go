package delivery

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sinks/intake"
)

// The headers each attempt carries besides the Standard Webhooks ones.
const (
	HeaderEventID         = "X-Event-Id"
	HeaderEventType       = "X-Event-Type"
	HeaderDeliveryAttempt = "X-Delivery-Attempt"
	HeaderRequestID       = "X-Request-Id"
)

const (
	// maxLoggedBody is how much of a response body an attempt keeps.
	maxLoggedBody = 4 << 10
	// maxDrainedBody is how much more is read so the connection can be
	// reused.
	maxDrainedBody = 64 << 10
	// recordTimeout bounds writing an attempt's outcome once the answer is
	// in, even while shutting down.
	recordTimeout = 10 * time.Second
)

// Options configure a Dispatcher. Zero fields take the defaults.
type Options struct {
	Logger *slog.Logger
	// Registerer receives the delivery metrics; nil registers none.
	Registerer prometheus.Registerer
	// Now is the clock the retry policy and the queue see (default
	// time.Now).
	Now func() time.Time
	// Rand returns numbers in [0, 1) that place the retry jitter (default
	// math/rand/v2's Float64).
	Rand func() float64
	// Poll is how often each target's queue is looked at when idle
	// (default 1s). Wake looks at once, and a worker also looks when a
	// retry of one of its own attempts comes due (within Poll/16).
	Poll time.Duration
	// Lease is how long a claimed row is kept from other claims while its
	// attempt is in flight and its outcome is being recorded (default, per
	// target, 2×Timeout plus the larger of ConnectTimeout and 10 s). A row
	// is sent only while its lease has more than the target's Timeout and
	// 10 s (to record the outcome) left, so Lease must be longer than that:
	// New refuses a shorter one.
	Lease time.Duration
	// Batch is the most due rows a worker claims at a time (default
	// DefaultBatch). A target claims fewer while its answers are so slow
	// that a whole batch could not be sent within half the part of the
	// lease in which a row may still be sent (see Lease).
	Batch int
	// Concurrency is how many requests each target may have in flight at
	// once, unless the target sets its own (default DefaultConcurrency). 1
	// sends a target's rows one after another.
	Concurrency int
	// Pacers, by target name, pace a target's attempts from the
	// rate-limit headers it answers with (X-RateLimit-Remaining with
	// X-RateLimit-Reset or Discord's X-RateLimit-Reset-After), and from its
	// configured rate_limit before the first answer.
	Pacers map[string]Pacer
	// StopGrace is how long the attempts in flight when Run's ctx ends may
	// still take to be answered (default DefaultStopGrace): no new attempt
	// starts, and those answered in time are recorded, so that a restart
	// does not send them again. Attempts still waiting after it are cut
	// short; their rows are sent again once their lease ends (at once
	// when a dispatcher next starts alone on the store), in their place in
	// the queue.
	StopGrace time.Duration
}

// Defaults for Options' zero fields.
const (
	DefaultBatch       = 128
	DefaultConcurrency = 1
	DefaultStopGrace   = 5 * time.Second
)

// RecordLinger is the longest the dispatcher waits, from the first attempt
// answered since its last record, for more attempts before it records
// them all in one Queue.RecordAttempts call; it records sooner once a
// batch is large or no attempt came for a millisecond. The workers do not
// wait for a record before they send on, so a little more latency on each
// costs nothing, while fewer, larger commits cost the store much less per
// attempt (a batch of 128 about half as much as one of 32). It is kept
// short all the same: a longer linger (10 ms was tried) makes larger
// commits, each holding a CPU longer, and on 2 cores the requests that
// wait behind one raise the fast targets' p99 more than the commits save.
const RecordLinger = 2 * time.Millisecond

// dueSlackPerPoll sets how late (Poll/dueSlackPerPoll at most) a worker
// may wake up for a retry of its own that comes due, so that retries
// spread over time do not wake it up once each (see dues).
const dueSlackPerPoll = 16

// firstBatch is the most rows a worker claims before it has timed any
// answer of its target.
const firstBatch = 16

// depthEvery is how often a worker counts its target's queued rows for the
// queue depth gauge, at most. Its state (pause, disabled) is read on every
// pass; counting the rows too would cost each pass more than the rest of it.
const depthEvery = time.Second

// depthCountShare bounds the time a worker spends counting its queue: the
// next count waits depthCountShare times as long as the last one took, if
// that is longer than depthEvery. Counting is linear in the queue (about
// 120 ms for a million rows), and a target that is down for a day is when
// its queue is longest: it gets a count every 6 s then, not every second.
const depthCountShare = 50

// depthEveryMax caps that spacing, so that one slow count (a pause of the
// process, a wait for a connection) does not freeze the gauge for long.
const depthEveryMax = 30 * time.Second

// stateEvery is how often a worker sending a batch reads its target's pause
// and disabled state again, so that a 429 or a 410 that another process
// sharing the store got (and stored) stops this batch too, not only the
// next one.
const stateEvery = 200 * time.Millisecond

// Pacer paces one target's requests (the rate-limit governor serves).
type Pacer interface {
	// Acquire blocks until a request may be sent, or ctx ends.
	Acquire(ctx context.Context) (PaceTicket, error)
}

// PauseReporter is a Pacer that pauses its target itself after a 429 (the
// rate-limit governor does, doubling the pauses of consecutive 429s), so
// that the target is tried again only when that pause ends too.
// PausedUntil returns the end of its current pause (zero or past when
// none). After a 429 the dispatcher asks it, so that the pause it stores
// (the target's paused_until) and logs is when the target will really be
// tried again, not just the answer's Retry-After.
type PauseReporter interface {
	PausedUntil(ctx context.Context) (time.Time, error)
}

// PauseLifter is a Pacer whose 429 pause can be ended before its time:
// the dispatcher lifts it when the target's stored pause was lifted
// (backstop deliveries targets enable), so that the target is tried again
// at once.
type PauseLifter interface {
	LiftPause(ctx context.Context) error
}

// PaceTicket is one paced request: Done with its answer, or Abort when
// there was none.
type PaceTicket interface {
	Done(status int, h http.Header)
	Abort()
}

// Dispatcher delivers each target's due rows, one worker per target, so a
// slow, limited or dead target never delays another.
//
// A worker claims a batch of due rows (leasing them), sends them with up
// to Concurrency requests in flight, and hands each answered attempt over
// to be recorded, with those of every other worker, in the next batch of
// records, without waiting for that to commit before it sends on: the
// lease keeps a row from being claimed again until its outcome is
// committed (or, should that fail or the process die, until the lease
// ends and the row is due again: at-least-once). A row is sent only while
// its lease leaves room for the whole attempt and its record, and an
// outcome or a release applies only to a row that still holds the lease it
// was claimed with, so a row is never sent under a lease another claim may
// take meanwhile, and a late outcome never overwrites a newer state.
type Dispatcher struct {
	pacers     map[string]Pacer
	q          Queue
	workers    []*worker
	byName     map[string]*worker
	logger     *slog.Logger
	now        func() time.Time
	rand       func() float64
	poll       time.Duration
	batch      int
	metrics    *metrics
	requestIDs *requestIDs
	batcher    *batcher
	running    atomic.Bool
	grace      time.Duration
	// inflight is the context of the requests Run's workers send: it ends
	// grace after Run's ctx (see Options.StopGrace). Set by Run before the
	// workers start.
	inflight context.Context
}

// worker is one target's queue.
type worker struct {
	t           Target
	concurrency int // requests in flight at most
	client      *http.Client
	redirects   *http.Client  // Redirect's (newRedirectClient)
	req         *http.Request // a POST to t.URL, parsed once, for newRequest
	signer      *signer       // nil when the target has no secret
	url         string        // t.URL as attempts log it (redacted)
	lease       time.Duration
	// room is how much of its lease a row must have left for its attempt
	// to start: the target's Timeout, then recordTimeout to record it.
	room   time.Duration
	wake   chan struct{}
	logger *slog.Logger
	m      targetMetrics

	// Used only by the worker's own goroutine.
	paused   bool
	disabled bool
	ahead    claim // claimed while the previous batch was sent

	// countedAt is when the queue depth was last counted, countEvery how
	// long until the next count (see depthEvery and depthCountShare);
	// guarded by mu (a batch's senders count it too, see targetQueue).
	countedAt  time.Time
	countEvery time.Duration

	// unrecorded holds one token per attempt whose record is not
	// committed yet, so that a slow store holds the sends back instead of
	// piling up outcomes in memory.
	unrecorded chan struct{}

	// mu guards what the answers of the current batch tell the worker.
	mu         sync.Mutex
	pauseUntil time.Time     // a 429 paused the target until then
	gone       bool          // a 410 disabled the target
	stopping   int           // 429 and 410 answers whose status is in but not yet pauseUntil or gone
	dues       dues          // when the retries of its outcomes come due
	took       time.Duration // moving average of the attempts' durations
	stateAt    time.Time     // when the target's stored state was last read
	reading    bool          // a sender is reading it now
	// storedPause is the end of the latest pause known to be stored for
	// the target (stored after its own 429, or read: another process's).
	// A stored pause only ever moves later, but for backstop deliveries
	// targets enable, which clears it: a read that finds an earlier one
	// (or none) while storedPause is still to come means the pause was
	// lifted (see notePause). pauseSeq counts the pauses stored here, so
	// that a read begun before one was stored is not taken for its lift;
	// lifts counts the lifts seen.
	storedPause time.Time
	pauseSeq    int
	lifts       int
}

// claim is a batch of rows claimed together and the end of the lease the
// claim gave them: the token that Release and the attempts' outcomes
// present, so that they touch only rows this claim still holds.
type claim struct {
	rows  []Row
	lease time.Time
	// full is set when the claim got all the rows it asked for: more may
	// be due.
	full bool
}

// New returns a dispatcher over q for targets; call Run to start it. It
// returns an error when a target fails Validate, two share a name, or
// Options.Lease leaves no room for an attempt and its record.
func New(q Queue, targets []Target, opts Options) (*Dispatcher, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Rand == nil {
		opts.Rand = rand.Float64
	}
	if opts.Poll <= 0 {
		opts.Poll = time.Second
	}
	if opts.Batch <= 0 {
		opts.Batch = DefaultBatch
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.StopGrace <= 0 {
		opts.StopGrace = DefaultStopGrace
	}
	d := &Dispatcher{
		grace:      opts.StopGrace,
		pacers:     opts.Pacers,
		q:          q,
		byName:     make(map[string]*worker, len(targets)),
		logger:     opts.Logger.With("component", "delivery"),
		now:        opts.Now,
		rand:       opts.Rand,
		poll:       opts.Poll,
		batch:      opts.Batch,
		metrics:    newMetrics(opts.Registerer),
		requestIDs: newRequestIDs(),
	}
	d.batcher = newBatcher(d, RecordLinger)
	for _, t := range targets {
		if err := t.Validate(); err != nil {
			return nil, err
		}
		if _, dup := d.byName[t.Name]; dup {
			return nil, fmt.Errorf("delivery: two targets are named %s", t.Name)
		}
		t = t.withDefaults()
		room := t.Timeout + recordTimeout
		lease := opts.Lease
		if lease <= 0 {
			lease = 2*t.Timeout + max(t.ConnectTimeout, recordTimeout)
		}
		if lease <= room {
			return nil, fmt.Errorf("delivery: target %s: lease %v must be longer than the timeout %v plus %v to record an attempt",
				t.Name, lease, t.Timeout, recordTimeout)
		}
		concurrency := t.Concurrency
		if concurrency == 0 {
			concurrency = opts.Concurrency
		}
		// A URL that does not parse leaves req nil: each attempt parses
		// it again and fails with the parser's error.
		req, _ := http.NewRequest(http.MethodPost, t.URL, http.NoBody)
		var sign *signer
		if t.Secret != "" {
			var err error
			if sign, err = newSigner(t.Secret); err != nil {
				return nil, fmt.Errorf("delivery: target %s: secret: %w", t.Name, err)
			}
		}
		w := &worker{
			t:           t,
			req:         req,
			signer:      sign,
			concurrency: concurrency,
			client:      newClient(t, concurrency),
			redirects:   newRedirectClient(t),
			url:         backstop.RedactURL(t.URL),
			lease:       lease,
			room:        room,
			wake:        make(chan struct{}, 1),
			dues:        dues{slack: opts.Poll / dueSlackPerPoll},
			logger:      d.logger.With("target", t.Name),
			m:           d.metrics.target(t.Name),
			unrecorded:  make(chan struct{}, 2*opts.Batch),
		}
		d.workers = append(d.workers, w)
		d.byName[t.Name] = w
	}
	return d, nil
}

// Run delivers until ctx is done, then starts no new attempt, waits for
// the attempts in flight to be answered (for Options.StopGrace at most)
// and for the records of those answered to commit, and returns nil.
// Attempts cut short after the grace are not recorded: their rows are due
// again when their lease ends, or at once when a dispatcher next starts
// alone on the store, in their place in the queue. Rows claimed but not
// sent are released.
// Run may be called once.
func (d *Dispatcher) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return errors.New("delivery: Run called twice")
	}
	inflight, cut := context.WithCancel(context.WithoutCancel(ctx))
	defer cut()
	d.inflight = inflight
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-ctx.Done():
		case <-finished:
			return
		}
		grace := time.NewTimer(d.grace)
		defer grace.Stop()
		select {
		case <-grace.C:
			cut()
		case <-finished:
		}
	}()
	go d.batcher.run(ctx)
	var wg sync.WaitGroup
	for _, w := range d.workers {
		wg.Go(func() {
			d.loop(ctx, w)
			d.release(ctx, w, w.ahead)
			w.ahead = claim{}
		})
	}
	wg.Wait()
	d.batcher.close()
	<-d.batcher.stopped
	// The targets' keep-alive connections end with the run, rather than
	// when they have idled for 90 s.
	for _, w := range d.workers {
		w.client.CloseIdleConnections()
		if w.redirects != nil {
			w.redirects.CloseIdleConnections()
		}
	}
	return nil
}

// Wake makes the worker of target look at its queue now (after rows were
// queued for it) instead of at its next poll. An unknown target is
// ignored.
func (d *Dispatcher) Wake(target string) {
	if w, ok := d.byName[target]; ok {
		w.poke()
	}
}

// poke makes w look at its queue now.
func (w *worker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// loop is one target's worker.
func (d *Dispatcher) loop(ctx context.Context, w *worker) {
	for {
		wait := d.pass(ctx, w)
		if ctx.Err() != nil {
			return
		}
		if wait <= 0 {
			continue
		}
		// A paused or disabled target's worker sleeps out its wait: new
		// rows (an intake commit wakes their target's worker) or due
		// retries cannot be sent before the pause ends, and the pass each
		// wake would start reads the store for nothing.
		wake := w.wake
		if w.paused || w.disabled {
			wake = nil
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-wake:
			timer.Stop()
		case <-timer.C:
		}
	}
}

// pass looks at the target's state, claims its due rows and delivers them.
// It returns how long to wait before the next pass.
func (d *Dispatcher) pass(ctx context.Context, w *worker) time.Duration {
	now := d.now()
	w.mu.Lock()
	w.dues.drop(now) // this pass claims their rows
	w.mu.Unlock()
	st, err := d.targetQueue(ctx, w)
	if err != nil {
		if ctx.Err() == nil {
			w.logger.Error("read target state", "err", err)
		}
		return d.poll
	}
	d.setDisabled(w, st.Disabled)
	if st.Disabled || st.PausedUntil.After(now) {
		d.release(ctx, w, w.ahead)
		w.ahead = claim{}
	}
	if st.Disabled {
		return d.poll
	}
	if st.PausedUntil.After(now) {
		d.setPaused(w, true)
		return min(st.PausedUntil.Sub(now), d.poll)
	}
	d.setPaused(w, false)

	limit := d.claimLimit(w)
	c := w.ahead
	w.ahead = claim{}
	if len(c.rows) == 0 {
		if c, err = d.claim(ctx, w, now, limit); err != nil {
			if ctx.Err() == nil {
				w.logger.Error("claim due deliveries", "err", err)
			}
			return d.poll
		}
	}
	// A full batch (one claimed ahead with a smaller limit counts): claim
	// the next one while this one is sent, so that the target does not
	// wait for a claim, or for its next poll, between batches.
	// (claimLimit keeps the two within the lease.)
	// With concurrency over 1 deliverAll claims the next rows itself as
	// slots free up (see its refills).
	var ahead chan claim
	if c.full && w.concurrency == 1 {
		ahead = make(chan claim, 1)
		go func() {
			next, err := d.claim(ctx, w, d.now(), limit)
			if err != nil && ctx.Err() == nil {
				w.logger.Error("claim due deliveries", "err", err)
			}
			ahead <- next
		}()
	}
	unsent, gone, backlog := d.deliverAll(ctx, w, c)
	if ahead != nil {
		w.ahead = <-ahead
	}
	if gone || ctx.Err() != nil {
		d.release(ctx, w, w.ahead)
		w.ahead = claim{}
	}
	for _, u := range unsent {
		d.release(ctx, w, u)
	}
	if ctx.Err() != nil {
		return 0
	}
	if gone {
		d.setDisabled(w, true)
		return d.poll
	}
	if len(w.ahead.rows) > 0 || backlog {
		return 0
	}
	wait := d.poll
	w.mu.Lock()
	next, ok := w.dues.next()
	w.mu.Unlock()
	if ok {
		wait = min(wait, max(next.Sub(d.now()), 0))
	}
	return wait
}

// targetQueue reads w's target state and, when the last count is old
// enough (see depthEvery, depthCountShare), counts its queued rows for the
// queue depth gauge. A pass reads it, and so do a batch's senders (see
// readState) and a batch held through a pause (see holdThrough), so that
// the gauge moves while a worker holds a long batch too.
func (d *Dispatcher) targetQueue(ctx context.Context, w *worker) (TargetState, error) {
	now := d.now()
	w.mu.Lock()
	counts := w.countedAt.IsZero() || now.Sub(w.countedAt) >= w.countEvery || now.Before(w.countedAt)
	seq := w.pauseSeq
	w.mu.Unlock()
	st, err := d.q.TargetQueue(ctx, w.t.Name, counts)
	if err == nil {
		d.notePause(ctx, w, st, seq)
	}
	if err != nil || !counts {
		return st, err
	}
	w.mu.Lock()
	w.countedAt = now
	w.countEvery = min(max(depthEvery, depthCountShare*d.now().Sub(now)), depthEveryMax)
	w.mu.Unlock()
	w.m.depth.Set(float64(st.Pending + st.Retrying))
	return st, nil
}

// notePause applies the pause st, w's target's state as read by a read
// begun when w.pauseSeq was seq, to what w knows of its stored pause: a
// later one is noted; an earlier one, or none, while the one noted is
// still to come means the pause was lifted (backstop deliveries targets
// enable): w's own pause ends, and so does its pacer's (PauseLifter), so
// that the target is sent to again at once rather than when the 429's
// Retry-After ends.
//
// Only a store with no pause left counts as a lift: one shorter than the
// one noted is a newer 429's, got after a lift by another process sharing
// the store (whose pacer holds that pause), and w keeps to the longer one
// it knows. A read begun before w stored a pause of its own (seq behind
// w.pauseSeq) may not show that pause yet, and is not taken for a lift.
func (d *Dispatcher) notePause(ctx context.Context, w *worker, st TargetState, seq int) {
	now := d.now()
	w.mu.Lock()
	lifted := seq == w.pauseSeq && w.storedPause.After(now) && !st.PausedUntil.After(now)
	switch {
	case lifted:
		w.storedPause, w.pauseUntil = time.Time{}, time.Time{}
		w.lifts++
	case st.PausedUntil.After(w.storedPause):
		w.storedPause = st.PausedUntil
	}
	w.mu.Unlock()
	if !lifted {
		return
	}
	w.logger.Info("target's pause lifted (deliveries targets enable): sending again")
	if l, ok := d.pacers[w.t.Name].(PauseLifter); ok {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
		defer cancel()
		if err := l.LiftPause(lctx); err != nil {
			w.logger.Error("lift the pacer's pause", "err", err)
		}
	}
}

// holdThrough waits, holding w's batch, until the pause that ends at
// until has passed (on the real clock, for until.Sub(d.now())) or is
// lifted (see notePause), or ctx ends (false). It counts the queue
// meanwhile, as a pass would.
func (d *Dispatcher) holdThrough(ctx context.Context, w *worker, until time.Time) bool {
	end := time.Now().Add(until.Sub(d.now()))
	w.mu.Lock()
	lifts := w.lifts
	w.mu.Unlock()
	for {
		left := time.Until(end)
		if left <= 0 {
			return true
		}
		w.mu.Lock()
		step := max(w.countEvery, depthEvery)
		w.mu.Unlock()
		if !sleep(ctx, min(left, step)) {
			return false
		}
		if _, err := d.targetQueue(ctx, w); err != nil && ctx.Err() == nil {
			w.logger.Error("read target state", "err", err)
		}
		w.mu.Lock()
		lifted := w.lifts != lifts
		w.mu.Unlock()
		if lifted {
			return true
		}
	}
}

// claim claims up to limit of w's rows due at now.
func (d *Dispatcher) claim(ctx context.Context, w *worker, now time.Time, limit int) (claim, error) {
	rows, err := d.q.ClaimDue(ctx, w.t.Name, now, limit, w.lease)
	if err != nil {
		return claim{}, err
	}
	return claim{rows: rows, lease: now.Add(w.lease), full: len(rows) >= limit}, nil
}

// claimLimit is how many rows w claims next: d.batch, or as many as its
// target answers, at the pace its answers came so far, within half the
// part of a lease in which a row may be sent (a row must keep w.room of
// it), so that a batch and the one claimed ahead are both sent in time.
func (d *Dispatcher) claimLimit(w *worker) int {
	w.mu.Lock()
	took := w.took
	w.mu.Unlock()
	if took <= 0 {
		return min(d.batch, firstBatch)
	}
	n := time.Duration(w.concurrency) * (w.lease - w.room) / (2 * took)
	return int(min(max(n, 1), time.Duration(d.batch)))
}

// release ends the claim of c's rows, claimed but not sent, so that they
// are due again at once rather than when their lease ends, in their place
// in the queue, which a claim does not move (a row a 429 answered goes
// before the rows queued during its pause); rows c no longer holds are
// left alone.
func (d *Dispatcher) release(ctx context.Context, w *worker, c claim) {
	if len(c.rows) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	if err := d.q.Release(rctx, c.rows, c.lease, d.now()); err != nil {
		w.logger.Error("release claimed deliveries", "count", len(c.rows), "err", err)
	}
}

// deliverAll attempts c's rows in the order claimed, up to w.concurrency
// at a time, and returns once every attempt it started has its answer
// (their records may still be committing), with the rows it did not send,
// by the claim that holds them. Once an answer pauses the target (a 429),
// no further row is sent until the pause ends, and then the rows the 429s
// answered are sent again first, in their order, before the rest: a 429
// does not cost a row its place in the queue (with concurrency 1 the
// target gets the rows in queue order). Once an answer disables the target
// (a 410), none is sent at all and deliverAll reports gone. No row is sent
// once its claim's lease has less than w.room left.
//
// With concurrency over 1, a sender that runs out of rows while others are
// still in flight does not leave its slot idle until they are answered: it
// claims the next rows (at once while the last claim was full, so a
// backlog flows claim after claim; else once rows come: Wake, or a retry
// of the worker's coming due) and sends them beside the requests in
// flight, so that one slow request holds one slot, not the target.
// backlog reports that the last claim was full: more rows may be due.
func (d *Dispatcher) deliverAll(ctx context.Context, w *worker, c claim) (unsent []claim, gone, backlog bool) {
	// items are the rows to send, in order, each with the end of the
	// lease of the claim that leased it: c's, then those of refills.
	type item struct {
		row   Row
		lease time.Time
	}
	items := make([]item, len(c.rows))
	for i, r := range c.rows {
		items[i] = item{row: r, lease: c.lease}
	}
	sendBy := func(lease time.Time) time.Time { return lease.Add(-w.room) }
	w.mu.Lock()
	w.pauseUntil, w.gone = time.Time{}, false
	w.stateAt = d.now() // pass has just read it
	w.mu.Unlock()
	// next is the next item to send; base is how many items were taken
	// and dropped from the front of items (a refill drops them, so that a
	// backlog flowing for hours does not keep an entry per row sent): the
	// place of items[i] in the pass is base+i. Both guarded by w.mu.
	next, base := 0, 0
	var held []item // taken but not sent (the lease ran short), guarded by w.mu
	// again holds the rows a 429 answered, by their place in the pass, to
	// be sent before items[next:]; guarded by w.mu.
	var again []resend
	// Refills (see above), guarded by w.mu: active counts the senders
	// running; refilling is set while one of them waits for rows, and idle
	// tells it when it is the last one left.
	refill := w.concurrency > 1 && len(c.rows) > 0
	// more is set while the last claim took every row it asked for: more
	// may be due, and a refill claims them at once rather than wait for a
	// wake; guarded by w.mu.
	more := c.full
	active, refilling := 0, false
	idle := make(chan struct{}, 1)
	// stopped reports, under w.mu, whether no row may be sent now.
	stopped := func(now time.Time) bool {
		return w.gone || w.stopping > 0 || ctx.Err() != nil || w.pauseUntil.After(now)
	}
	// take returns the next row to send, with its claim's lease, and its
	// place in the pass (base plus its index in items), or false once
	// there is none or the target must not be sent more now (out reports
	// that the rows ran out, nothing else).
	take := func() (at int, it item, ok, out bool) {
		w.mu.Lock()
		defer w.mu.Unlock()
		now := d.now()
		if next == len(items) && len(again) == 0 {
			return 0, item{}, false, !stopped(now)
		}
		if stopped(now) {
			return 0, item{}, false, false
		}
		if len(again) > 0 {
			r := again[0]
			if now.After(sendBy(r.lease)) {
				return 0, item{}, false, false
			}
			again = again[1:]
			return r.at, item{row: r.row, lease: r.lease}, true, false
		}
		if now.After(sendBy(items[next].lease)) {
			return 0, item{}, false, false
		}
		next++
		it = items[next-1]
		items[next-1].row = Row{} // taken: its payload is the sender's now
		return base + next - 1, it, true, false
	}
	var senders sync.WaitGroup
	var send func()
	// refillRows waits, as the one sender without a row while others
	// send, for rows to come due, and claims them: it returns true when it
	// claimed some (and started a sender for every other free slot, to
	// send the rest or, with none left, to wait as the next refill),
	// false when there is nothing to wait for (the others are done, the
	// target stopped, or ctx ended).
	refillRows := func() (refilled bool) {
		w.mu.Lock()
		if !refill || refilling || active == 1 {
			w.mu.Unlock()
			return false
		}
		select {
		case <-idle: // a token left from an earlier wait
		default:
		}
		refilling = true
		w.mu.Unlock()
		woken := false  // a wake was taken from the worker
		handed := false // refilling was ended, under w.mu, for the senders started
		defer func() {
			w.mu.Lock()
			if !handed {
				refilling = false
			}
			w.mu.Unlock()
			if woken && !refilled {
				// Not this refill's to use: the next pass's.
				w.poke()
			}
		}()
		for {
			w.mu.Lock()
			due, hasDue := w.dues.next()
			backlog := more
			w.mu.Unlock()
			wait := d.poll
			if hasDue {
				wait = min(wait, max(due.Sub(d.now()), 0))
			}
			if backlog {
				wait = 0
			}
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return false
			case <-idle:
				timer.Stop()
				return false
			case <-w.wake:
				timer.Stop()
				woken = true
			case <-timer.C:
			}
			d.readState(ctx, w) // another process may have paused or disabled the target
			now := d.now()
			w.mu.Lock()
			if stopped(now) || active == 1 {
				w.mu.Unlock()
				return false
			}
			free := w.concurrency - active + 1
			w.dues.drop(now) // this claim takes their rows
			w.mu.Unlock()
			// As many as a pass would claim: those beyond the free slots
			// wait in memory for one, under their lease (claimLimit keeps
			// them within it).
			got, err := d.claim(ctx, w, now, d.claimLimit(w))
			if err != nil {
				if ctx.Err() == nil {
					w.logger.Error("claim due deliveries", "err", err)
				}
				return false
			}
			w.mu.Lock()
			more = got.full
			w.mu.Unlock()
			if len(got.rows) == 0 {
				woken = false // used: nothing was due
				continue
			}
			w.mu.Lock()
			// The rows taken are dropped: senders and again know theirs
			// by their place in the pass and their lease.
			kept := copy(items, items[next:])
			clear(items[kept:])
			items, base, next = items[:kept], base+next, 0
			for _, r := range got.rows {
				items = append(items, item{row: r, lease: got.lease})
			}
			// A sender for every free slot but this one's, which sends
			// the first row: those without a row (more slots than rows)
			// wait for the next, one of them as the refill, so that a
			// row that comes while every row in flight hangs still
			// takes a free slot at once.
			extra := free - 1
			active += extra
			// Ended before they start, so that one of them may wait as
			// the next refill (the deferred end must not undo theirs).
			refilling, handed = false, true
			w.mu.Unlock()
			for range extra {
				senders.Go(send)
			}
			return true
		}
	}
	// send is one sender: it sends one row after another until the rows
	// run out (and no refill brings more) or an answer stops it.
	send = func() {
		defer func() {
			w.mu.Lock()
			active--
			if active == 1 && refilling {
				select {
				case idle <- struct{}{}:
				default:
				}
			}
			w.mu.Unlock()
		}()
		for {
			d.readState(ctx, w)
			at, it, ok, out := take()
			if !ok {
				if out && refillRows() {
					continue
				}
				return
			}
			sent, re := d.deliver(ctx, w, it.row, it.lease, sendBy(it.lease))
			w.mu.Lock()
			switch {
			case !sent:
				held = append(held, it)
			case re != nil:
				re.at, re.lease = at, it.lease
				i, _ := slices.BinarySearchFunc(again, at, func(r resend, at int) int { return r.at - at })
				again = slices.Insert(again, i, *re)
			}
			w.mu.Unlock()
		}
	}
	// unsentRows returns the rows not sent, by claim, once the records of
	// the 429s among them are done: releasing a row before its 429's
	// record commits would leave that record without the lease it checks.
	unsentRows := func() []claim {
		w.mu.Lock()
		var out []claim // by lease: a release checks each row's
		add := func(row Row, lease time.Time) {
			i := slices.IndexFunc(out, func(c claim) bool { return c.lease.Equal(lease) })
			if i < 0 {
				out = append(out, claim{lease: lease})
				i = len(out) - 1
			}
			out[i].rows = append(out[i].rows, row)
		}
		for _, it := range held {
			add(it.row, it.lease)
		}
		waits := make([]<-chan struct{}, 0, len(again))
		for _, r := range again {
			add(r.row, r.lease)
			waits = append(waits, r.recorded)
		}
		for _, it := range items[next:] {
			add(it.row, it.lease)
		}
		w.mu.Unlock()
		for _, ch := range waits {
			<-ch
		}
		return out
	}
	for {
		// Senders, each sending one row after another, until the rows
		// run out or an answer stops them.
		w.mu.Lock()
		count := min(w.concurrency, len(items)-next+len(again))
		if refill && base+next == 0 {
			// Every slot gets a sender, the spare ones to take the
			// rows that come while the claimed ones are sent.
			count = w.concurrency
		}
		active = count
		w.mu.Unlock()
		for range count {
			senders.Go(send)
		}
		senders.Wait()
		w.mu.Lock()
		until, left := w.pauseUntil, len(items)-next+len(again)
		gone = w.gone
		// The earliest moment a row left may still be sent.
		var last time.Time
		for _, r := range again {
			if by := sendBy(r.lease); last.IsZero() || by.Before(last) {
				last = by
			}
		}
		if next < len(items) {
			if by := sendBy(items[next].lease); last.IsZero() || by.Before(last) {
				last = by
			}
		}
		w.mu.Unlock()
		if gone || left == 0 || ctx.Err() != nil || d.now().After(last) || until.After(last) {
			// Done, stopped, out of lease, or paused for longer than the
			// lease lets the rest be held: it is released, and the next
			// pass waits for the pause.
			w.mu.Lock()
			backlog = more
			w.mu.Unlock()
			return unsentRows(), gone, backlog
		}
		// The rest of the batch is claimed: hold it until the pause ends
		// rather than leave it to its lease.
		d.setPaused(w, true)
		ok := d.holdThrough(ctx, w, until)
		d.setPaused(w, false)
		if !ok {
			return unsentRows(), false, false
		}
		w.mu.Lock()
		w.pauseUntil = time.Time{} // slept out (no sender runs meanwhile)
		w.mu.Unlock()
	}
}

// requestContext is the context of an attempt's request: for Run's own
// attempts the one that outlives Run's ctx by the stop grace, for a
// redirect (or outside Run) ctx.
func (d *Dispatcher) requestContext(ctx context.Context, redirect bool) context.Context {
	if redirect || d.inflight == nil {
		return ctx
	}
	return d.inflight
}

// readState reads the target's stored pause and disabled state once
// stateEvery has passed since the last read (and no other sender of w is
// reading it), and applies them to the batch being sent: a pause or a 410
// that another process sharing the store got stops this batch as if its
// own answer had said so.
func (d *Dispatcher) readState(ctx context.Context, w *worker) {
	w.mu.Lock()
	if w.reading || d.now().Sub(w.stateAt) < stateEvery {
		w.mu.Unlock()
		return
	}
	w.reading = true
	w.mu.Unlock()
	st, err := d.targetQueue(ctx, w)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.reading = false
	w.stateAt = d.now()
	if err != nil {
		if ctx.Err() == nil {
			w.logger.Error("read target state", "err", err)
		}
		return
	}
	if st.Disabled {
		w.gone = true
	}
	w.pauseUntil = later(w.pauseUntil, st.PausedUntil)
}

// resend is a row a 429 answered, to be sent again, first, once the pause
// ends, under the claim it was sent under (see deliverAll).
type resend struct {
	at    int       // its place in the pass's rows (see deliverAll)
	lease time.Time // the end of the lease of its claim
	row   Row       // as it is after the 429 (Attempts counts it)
	// recorded is closed once the 429's record is done (committed or
	// given up).
	recorded <-chan struct{}
}

// errLeaseShort is send's when the row's lease has too little left for an
// attempt (it waited that long for its pacer): it is not sent.
var errLeaseShort = errors.New("delivery: the lease has too little left to send")

// errNotSent is send's when ctx ended while the attempt waited for its
// target's pacer, before anything was sent: the caller releases the row.
var errNotSent = errors.New("delivery: stopped before the attempt was sent")

// deliver makes one attempt at row, claimed with the lease that ends at
// lease, tells the worker at once what the policy makes of its answer
// (pause, disable, retry time) and hands the attempt to record. It reports
// false, sending nothing, when the row may not be sent any more (after
// sendBy) or ctx ended while it waited for the target's pacer: the caller
// releases it. An attempt in flight when ctx ends goes on for the stop
// grace; one cut short after it is dropped: the row is due again when its
// lease ends.
//
// A 429 returns the row to send again once the pause ends (again): its
// record keeps the row under the claim's lease, in its place in the
// queue, rather than making it due when the pause ends, after the rows
// behind it.
func (d *Dispatcher) deliver(ctx context.Context, w *worker, row Row, lease, sendBy time.Time) (sent bool, again *resend) {
	a, answer, err := d.send(ctx, w, row, w.t.URL, row.Attempts+1, false, sendBy)
	// The room the lease keeps for the record starts with the answer.
	recordBy := time.Now().Add(recordTimeout)
	if errors.Is(err, errLeaseShort) || errors.Is(err, errNotSent) {
		return false, nil
	}
	if err != nil && d.requestContext(ctx, false).Err() != nil {
		return true, nil // cut short by the end of the stop grace
	}
	now := d.now()
	dec := Next(w.t.RetrySchedule, a.Attempt, row.Failures, a.StatusCode, answer, err, now, d.rand())
	if dec.Pause > 0 {
		d.pacerPause(ctx, w, &dec, now)
	}
	w.mu.Lock()
	if err == nil && stops(a.StatusCode) {
		w.stopping-- // counted by send; pauseUntil or gone set below
	}
	if w.took == 0 {
		w.took = a.Duration
	} else {
		w.took += (a.Duration - w.took) / 8
	}
	if dec.Pause > 0 {
		w.pauseUntil = later(w.pauseUntil, now.Add(dec.Pause))
	}
	if dec.Disable {
		w.gone = true
	}
	if dec.Status == StatusRetrying && dec.Pause == 0 {
		w.dues.add(dec.NextAttemptAt)
	}
	w.mu.Unlock()

	if dec.Pause > 0 || dec.Disable {
		d.stopTarget(ctx, w, a, dec, now)
	}
	if dec.Pause > 0 {
		// The row stays claimed, in its place in the queue (due first
		// when the claim ends, should the process die: its record keeps
		// its NextAttemptAt, as the Lease it gives as NextAttemptAt says
		// to), and is sent again from memory; released with the rest if
		// the pause outlasts the claim.
		recorded := make(chan struct{})
		d.handOver(handedOver{w: w, row: row, a: a, dec: dec, now: now, by: recordBy, recorded: recorded,
			out: Outcome{Status: dec.Status, NextAttemptAt: lease, Failures: dec.Failures, Lease: lease}})
		next := row
		next.Attempts, next.Failures = a.Attempt, dec.Failures
		return true, &resend{row: next, recorded: recorded}
	}
	d.record(w, row, a, dec, now, lease, recordBy)
	return true, nil
}

// pacerPause lengthens the pause of dec, a 429's decision made at now, to
// the end of the pause w's pacer holds, when it reports a later one (see
// PauseReporter).
func (d *Dispatcher) pacerPause(ctx context.Context, w *worker, dec *Decision, now time.Time) {
	pr, ok := d.pacers[w.t.Name].(PauseReporter)
	if !ok {
		return
	}
	until, err := pr.PausedUntil(context.WithoutCancel(ctx))
	if err != nil {
		w.logger.Error("read the pacer's pause", "err", err)
		return
	}
	if until.After(now.Add(dec.Pause)) {
		dec.Pause = until.Sub(now)
		dec.NextAttemptAt = until
		dec.Reason = pauseReason(dec.Pause)
	}
}

// stopTarget stores the pause or the disabling that attempt a's decision
// dec makes of w's target.
func (d *Dispatcher) stopTarget(ctx context.Context, w *worker, a Attempt, dec Decision, now time.Time) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	if dec.Pause > 0 {
		if err := d.q.PauseTarget(sctx, w.t.Name, now.Add(dec.Pause)); err != nil {
			w.logger.Error("pause target", "err", err)
		} else {
			w.mu.Lock()
			w.storedPause = later(w.storedPause, now.Add(dec.Pause))
			w.pauseSeq++
			w.mu.Unlock()
		}
		w.logger.Info("target paused", "for", dec.Pause)
	}
	if dec.Disable {
		reason := fmt.Sprintf("%s from %s on %s", dec.Reason, a.URL, now.UTC().Format(time.RFC3339))
		if err := d.q.DisableTarget(sctx, w.t.Name, reason, now); err != nil {
			w.logger.Error("disable target", "err", err)
		}
		w.logger.Warn("target disabled", "reason", reason)
	}
}

// record hands attempt a of row, made under the lease that ends at
// lease, with its decision over to the batcher, which records, counts and
// logs it in the background, or gives its record up at by (the real
// clock). It blocks while too many of w's attempts wait for their records.
func (d *Dispatcher) record(w *worker, row Row, a Attempt, dec Decision, now, lease, by time.Time) {
	d.handOver(handedOver{w: w, row: row, a: a, dec: dec, now: now, by: by,
		out: Outcome{Status: dec.Status, NextAttemptAt: dec.NextAttemptAt, Failures: dec.Failures, Lease: lease}})
}

// handOver hands h over to the batcher (see record).
func (d *Dispatcher) handOver(h handedOver) {
	h.w.unrecorded <- struct{}{}
	d.batcher.add(h)
}

// attemptLog is logger with attempt a of row and its outcome.
func attemptLog(logger *slog.Logger, row Row, a Attempt, dec Decision) *slog.Logger {
	return logger.With("delivery", row.ID, "event_id", row.EventID, "attempt", a.Attempt,
		"status", a.StatusCode, "request_id", a.RequestID, "outcome", dec.Status)
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Redirect sends row once, now, to rawURL instead of its target's URL,
// through the SSRF guard with the AllowPrivate setting of the row's
// target, and records it as a Redirect attempt, which leaves the
// delivery's status, failures and next attempt unchanged. It returns the
// recorded attempt. A non-2xx answer or a transport failure is not an
// error: the Attempt says what happened. It returns an error when the
// row's target is unknown, when the URL is refused (the refusal is still
// recorded, and wraps ErrRefused), when ctx is cancelled before an answer,
// or when the attempt cannot be recorded. An attempt cut short by ctx's
// deadline is recorded as a timeout, and is no error either.
//
// The redirect is an attempt of the delivery with a number of its own:
// the next one, which the delivery's attempt count moves to, so that the
// next attempt (another redirect, or its target's) gets the one after it.
// When the queue is an AttemptReserver the number is taken from it before
// anything is sent; else it is row.Attempts+1. While the row is claimed
// for sending (its attempt in flight has the next number) the redirect is
// refused with an error wrapping backstop.ErrInFlight (a
// *backstop.InFlightError that says until when), and nothing is sent or
// recorded.
func (d *Dispatcher) Redirect(ctx context.Context, row Row, rawURL string) (Attempt, error) {
	w, ok := d.byName[row.Target]
	if !ok {
		return Attempt{}, fmt.Errorf("delivery: redirect %d: unknown target %q", row.ID, row.Target)
	}
	number, err := d.redirectNumber(ctx, row)
	if err != nil {
		return Attempt{}, fmt.Errorf("delivery: redirect %d: %w", row.ID, err)
	}
	var (
		a       Attempt
		refused error
	)
	if err := checkURL(rawURL, w.t.AllowPrivate); err != nil {
		refused = err
		a = Attempt{DeliveryID: row.ID, Target: row.Target, URL: backstop.RedactURL(rawURL), Attempt: number,
			Error: err.Error(), RequestID: d.requestIDs.next(), At: d.now(), Redirect: true}
	} else {
		var err error
		a, _, err = d.send(ctx, w, row, rawURL, number, true, time.Time{})
		if err != nil && errors.Is(ctx.Err(), context.Canceled) {
			return a, fmt.Errorf("delivery: redirect %d: %w", row.ID, ctx.Err())
		}
		var re *RefusedError
		if errors.As(err, &re) {
			refused = re
		}
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	ids, err := d.q.RecordAttempts(rctx, []AttemptRecord{{Attempt: a, Outcome: Outcome{Status: row.Status, NextAttemptAt: row.NextAttemptAt}}})
	if err != nil {
		return a, fmt.Errorf("delivery: redirect %d: record attempt: %w", row.ID, err)
	}
	a.ID = ids[0]
	w.m.attempt("redirect").Inc()
	if refused != nil {
		return a, fmt.Errorf("delivery: redirect %d: %w", row.ID, refused)
	}
	return a, nil
}

// redirectNumber returns the attempt number of a redirect of row (see
// Redirect).
func (d *Dispatcher) redirectNumber(ctx context.Context, row Row) (int, error) {
	now := d.now()
	if r, ok := d.q.(AttemptReserver); ok {
		rctx, cancel := context.WithTimeout(ctx, recordTimeout)
		defer cancel()
		return r.ReserveAttempt(rctx, row.ID, now)
	}
	// The row as the caller read it: its claim then.
	if (row.Status == StatusPending || row.Status == StatusRetrying) && row.ClaimedUntil.After(now) {
		return 0, &backstop.InFlightError{Until: row.ClaimedUntil}
	}
	return row.Attempts + 1, nil
}

// send POSTs row to rawURL once with w's target settings and client. It
// returns the attempt (not yet recorded), the answer's headers (for its
// Retry-After and Date), and the transport error when no answer came (also in Attempt.Error). It
// returns errLeaseShort, sending nothing, when sendBy is set and has passed
// once the pacer lets the request go.
func (d *Dispatcher) send(ctx context.Context, w *worker, row Row, rawURL string, attempt int, redirect bool, sendBy time.Time) (Attempt, http.Header, error) {
	t, client := w.t, w.client
	if redirect {
		client = w.redirects
	}
	shown := w.url
	if rawURL != t.URL {
		shown = backstop.RedactURL(rawURL)
	}
	body := sentBody(row, t.MaxPayload)
	a := Attempt{
		DeliveryID: row.ID,
		Target:     row.Target,
		URL:        shown,
		Attempt:    attempt,
		RequestID:  d.requestIDs.next(),
		At:         d.now(),
		Redirect:   redirect,
	}
	fail := func(err error) (Attempt, http.Header, error) {
		a.Error = describe(err)
		return a, nil, err
	}
	// The pacer's wait comes first: it is neither taken from the request's
	// Timeout nor part of the age of its signature's timestamp.
	var ticket PaceTicket
	if p := d.pacers[t.Name]; p != nil && !redirect {
		// The target's own X-RateLimit-* answers pace its queue, so it
		// never has to answer 429.
		var err error
		if ticket, err = p.Acquire(ctx); err != nil {
			if ctx.Err() != nil {
				return a, nil, errNotSent
			}
			return fail(err)
		}
		a.At = d.now()
	}
	answered := false
	defer func() {
		if ticket != nil && !answered {
			ticket.Abort()
		}
	}()
	if !sendBy.IsZero() && d.now().After(sendBy) {
		return a, nil, errLeaseShort
	}
	// The client's transport alone: redirects are not followed, so the
	// client's redirect machinery (a copy of every header) is not needed;
	// the target's timeout bounds the whole exchange as it would there.
	rctx, cancel := context.WithTimeout(d.requestContext(ctx, redirect), t.Timeout)
	defer cancel()
	req, err := w.newRequest(rctx, rawURL, body)
	if err != nil {
		return fail(err)
	}
	h := make(http.Header, len(t.Headers)+len(attemptHeaders))
	if !redirect {
		// The target's headers are its credentials: a redirect, which
		// goes to whatever URL the operator gives, is sent without them.
		for k, v := range t.Headers {
			h.Set(k, v)
		}
	}
	// Set after the target's own headers, which cannot replace them; one
	// allocation holds every value.
	vals := make([]string, 0, len(attemptHeaders))
	set := func(key, v string) {
		vals = append(vals, v)
		h[key] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	set(hContentType, "application/json")
	set(hUserAgent, "backstop")
	// The event's id, or a proxied payload's key as its caller sent it
	// (backstop.Delivery.EventID): never the outbox's internal key. In
	// its header form, which the signature covers.
	id := HeaderForm(row.EventID)
	set(hWebhookID, id)
	ts := strconv.FormatInt(a.At.Unix(), 10)
	set(hWebhookTimestamp, ts)
	if w.signer != nil {
		set(hWebhookSignature, w.signer.sign(id, ts, body))
	}
	set(hEventID, id)
	set(hEventType, HeaderForm(row.EventType))
	set(hDeliveryAttempt, strconv.Itoa(attempt))
	set(hRequestID, a.RequestID)
	req.Header = h
	if u := req.URL.User; u != nil && h.Get("Authorization") == "" {
		// A user and password in the URL, sent as net/http's Client
		// would send them (its transport alone does not).
		pass, _ := u.Password()
		req.SetBasicAuth(u.Username(), pass)
	}

	start := time.Now()
	resp, err := client.Transport.RoundTrip(req)
	if err != nil {
		a.Duration = time.Since(start)
		if errors.Is(err, context.DeadlineExceeded) && errors.Is(rctx.Err(), context.DeadlineExceeded) {
			// Not "context deadline exceeded": say which deadline, the
			// target's timeout or the caller's, when that was sooner.
			a.Error = fmt.Sprintf("timeout: no answer within %v (the target's timeout)", t.Timeout)
			if dl, ok := ctx.Deadline(); ok && dl.Sub(start) < t.Timeout {
				a.Error = fmt.Sprintf("timeout: no answer within %v", dl.Sub(start).Round(time.Second))
			}
			return a, nil, err
		}
		return fail(err)
	}
	defer resp.Body.Close()
	if !redirect && stops(resp.StatusCode) {
		// No new send once the status is in, while the body is read.
		w.mu.Lock()
		w.stopping++
		w.mu.Unlock()
	}
	if ticket != nil {
		answered = true
		ticket.Done(resp.StatusCode, resp.Header)
	}
	a.StatusCode = resp.StatusCode
	buf := bodyBufs.Get().(*[]byte)
	n, err := io.ReadFull(resp.Body, *buf)
	a.Body = strings.ToValidUTF8(string((*buf)[:n]), "\uFFFD")
	if err == nil { // more than maxLoggedBody: drain some more
		for drained := 0; drained < maxDrainedBody; {
			m, err := resp.Body.Read((*buf)[:min(len(*buf), maxDrainedBody-drained)])
			drained += m
			if err != nil {
				break
			}
		}
	}
	bodyBufs.Put(buf)
	a.Duration = time.Since(start)
	return a, resp.Header, nil
}

// newRequest returns a POST of body to rawURL, without headers. To the
// target's own URL it is a copy of w's parsed request, which spares
// parsing the URL again on every attempt.
func (w *worker) newRequest(ctx context.Context, rawURL string, body []byte) (*http.Request, error) {
	if w.req == nil || rawURL != w.t.URL {
		return http.NewRequestWithContext(ctx, http.MethodPost, rawURL, bytes.NewReader(body))
	}
	req := w.req.WithContext(ctx)
	req.ContentLength = int64(len(body))
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(body)), nil
	}
	if len(body) == 0 {
		req.Body, req.GetBody = http.NoBody, nil
	}
	return req, nil
}

// stops reports whether an answer with status stops the target's sends
// (429 pauses it, 410 disables it).
func stops(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusGone
}

// The canonical forms of the headers each attempt sets.
var (
	hContentType      = http.CanonicalHeaderKey("Content-Type")
	hUserAgent        = http.CanonicalHeaderKey("User-Agent")
	hWebhookID        = http.CanonicalHeaderKey(intake.HeaderWebhookID)
	hWebhookTimestamp = http.CanonicalHeaderKey(intake.HeaderWebhookTimestamp)
	hWebhookSignature = http.CanonicalHeaderKey(intake.HeaderWebhookSignature)
	hEventID          = http.CanonicalHeaderKey(HeaderEventID)
	hEventType        = http.CanonicalHeaderKey(HeaderEventType)
	hDeliveryAttempt  = http.CanonicalHeaderKey(HeaderDeliveryAttempt)
	hRequestID        = http.CanonicalHeaderKey(HeaderRequestID)

	attemptHeaders = []string{hContentType, hUserAgent, hWebhookID, hWebhookTimestamp,
		hWebhookSignature, hEventID, hEventType, hDeliveryAttempt, hRequestID}
)

// ReservedHeader tells why a target's configured header name (any case)
// cannot be sent as configured: backstop sets it on every attempt, after
// the target's headers (the signature only when the target has a secret,
// but a fixed value could never be a signature of each body), or the
// HTTP client writes its own (Host, Content-Length). ok is false for any
// other name.
func ReservedHeader(name string) (why string, ok bool) {
	canon := http.CanonicalHeaderKey(name)
	switch canon {
	case "Host", "Content-Length", "Transfer-Encoding", "Trailer":
		return "is written by the HTTP client from the URL and the body, not taken from headers: leave it out", true
	case hWebhookSignature:
		return "is backstop's signature of each delivery, made with the target's secret: leave it out and set secret", true
	}
	if slices.Contains(attemptHeaders, canon) {
		return "is set by backstop on every delivery, which would replace this value: leave it out", true
	}
	return "", false
}

// bodyBufs are buffers of maxLoggedBody bytes for the start of answers.
var bodyBufs = sync.Pool{New: func() any {
	b := make([]byte, maxLoggedBody)
	return &b
}}

// describe turns a transport error into the attempt's error text: the SSRF
// refusal alone when there is one, else the error without the URL (which
// the attempt holds already, redacted).
func describe(err error) string {
	var re *RefusedError
	if errors.As(err, &re) {
		return re.Error()
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// requestIDs makes the X-Request-Id of each attempt: random (version 4)
// UUIDs read from a ChaCha8 stream seeded from crypto/rand, so that an
// attempt costs no system call for its id. It is safe for concurrent use.
type requestIDs struct {
	mu sync.Mutex
	r  *rand.ChaCha8
}

func newRequestIDs() *requestIDs {
	var seed [32]byte
	_, _ = crand.Read(seed[:]) // never fails (crypto/rand panics instead)
	return &requestIDs{r: rand.NewChaCha8(seed)}
}

// next returns a new request id.
func (g *requestIDs) next() string {
	var id uuid.UUID
	g.mu.Lock()
	binary.BigEndian.PutUint64(id[:8], g.r.Uint64())
	binary.BigEndian.PutUint64(id[8:], g.r.Uint64())
	g.mu.Unlock()
	id[6] = id[6]&0x0f | 0x40 // version 4
	id[8] = id[8]&0x3f | 0x80 // the RFC 4122 variant
	return id.String()
}

// setPaused keeps the paused-targets gauge in step with w.
func (d *Dispatcher) setPaused(w *worker, paused bool) {
	if w.paused == paused {
		return
	}
	w.paused = paused
	if paused {
		d.metrics.paused.Inc()
	} else {
		d.metrics.paused.Dec()
	}
}

// setDisabled keeps the disabled-targets gauge in step with w.
func (d *Dispatcher) setDisabled(w *worker, disabled bool) {
	if w.disabled == disabled {
		return
	}
	w.disabled = disabled
	if disabled {
		d.metrics.disabled.Inc()
	} else {
		d.metrics.disabled.Dec()
	}
}

// sleep waits for d or ctx; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
