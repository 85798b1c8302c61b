package delivery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

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
	// (default 1s). Wake looks at once.
	Poll time.Duration
	// Lease is how long a claimed row is kept from other claims while its
	// attempt is in flight (default, per target, 2×Timeout+ConnectTimeout).
	Lease time.Duration
	// Batch is how many due rows a worker claims at a time (default 16).
	Batch int
	// Pacers, by target name, pace a target's attempts from the
	// rate-limit headers it answers with (X-RateLimit-Remaining with
	// X-RateLimit-Reset or Discord's X-RateLimit-Reset-After), and from its
	// configured rate_limit before the first answer.
	Pacers map[string]Pacer
}

// Pacer paces one target's requests (the rate-limit governor serves).
type Pacer interface {
	// Acquire blocks until a request may be sent, or ctx ends.
	Acquire(ctx context.Context) (PaceTicket, error)
}

// PaceTicket is one paced request: Done with its answer, or Abort when
// there was none.
type PaceTicket interface {
	Done(status int, h http.Header)
	Abort()
}

// Dispatcher delivers each target's due rows, one worker per target, so a
// slow, limited or dead target never delays another.
type Dispatcher struct {
	pacers  map[string]Pacer
	q       Queue
	workers []*worker
	byName  map[string]*worker
	logger  *slog.Logger
	now     func() time.Time
	rand    func() float64
	poll    time.Duration
	batch   int
	metrics *metrics
	running atomic.Bool
}

// worker is one target's queue. Its fields other than wake are used only
// by its own goroutine, or are immutable.
type worker struct {
	t        Target
	client   *http.Client
	lease    time.Duration
	wake     chan struct{}
	logger   *slog.Logger
	nextDue  time.Time
	paused   bool
	disabled bool
}

// New returns a dispatcher over q for targets; call Run to start it. It
// returns an error when a target fails Validate or two share a name.
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
		opts.Batch = 16
	}
	d := &Dispatcher{
		pacers:  opts.Pacers,
		q:       q,
		byName:  make(map[string]*worker, len(targets)),
		logger:  opts.Logger.With("component", "delivery"),
		now:     opts.Now,
		rand:    opts.Rand,
		poll:    opts.Poll,
		batch:   opts.Batch,
		metrics: newMetrics(opts.Registerer),
	}
	for _, t := range targets {
		if err := t.Validate(); err != nil {
			return nil, err
		}
		if _, dup := d.byName[t.Name]; dup {
			return nil, fmt.Errorf("delivery: two targets are named %s", t.Name)
		}
		t = t.withDefaults()
		lease := opts.Lease
		if lease <= 0 {
			lease = 2*t.Timeout + t.ConnectTimeout
		}
		w := &worker{
			t:      t,
			client: NewClient(t),
			lease:  lease,
			wake:   make(chan struct{}, 1),
			logger: d.logger.With("target", t.Name),
		}
		d.workers = append(d.workers, w)
		d.byName[t.Name] = w
	}
	return d, nil
}

// Run delivers until ctx is done, then waits for the attempts in flight
// to end and returns nil. Attempts cut short by ctx are not recorded: their
// rows are due again when their lease ends. Run may be called once.
func (d *Dispatcher) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return errors.New("delivery: Run called twice")
	}
	done := make(chan struct{}, len(d.workers))
	for _, w := range d.workers {
		go func() {
			defer func() { done <- struct{}{} }()
			d.loop(ctx, w)
		}()
	}
	for range d.workers {
		<-done
	}
	return nil
}

// Wake makes the worker of target look at its queue now (after rows were
// queued for it) instead of at its next poll. An unknown target is
// ignored.
func (d *Dispatcher) Wake(target string) {
	if w, ok := d.byName[target]; ok {
		select {
		case w.wake <- struct{}{}:
		default:
		}
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
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-w.wake:
			timer.Stop()
		case <-timer.C:
		}
	}
}

// pass looks at the target's state, claims its due rows and delivers them
// in order. It returns how long to wait before the next pass.
func (d *Dispatcher) pass(ctx context.Context, w *worker) time.Duration {
	now := d.now()
	if !w.nextDue.After(now) {
		w.nextDue = time.Time{}
	}
	states, err := d.q.TargetStates(ctx, []string{w.t.Name})
	if err != nil {
		if ctx.Err() == nil {
			w.logger.Error("read target state", "err", err)
		}
		return d.poll
	}
	var st TargetState
	if len(states) > 0 {
		st = states[0]
	}
	d.metrics.depth.WithLabelValues(w.t.Name).Set(float64(st.Pending + st.Retrying))
	d.setDisabled(w, st.Disabled)
	if st.Disabled {
		return d.poll
	}
	if st.PausedUntil.After(now) {
		d.setPaused(w, true)
		return min(st.PausedUntil.Sub(now), d.poll)
	}
	d.setPaused(w, false)

	rows, err := d.q.ClaimDue(ctx, w.t.Name, now, d.batch, w.lease)
	if err != nil {
		if ctx.Err() == nil {
			w.logger.Error("claim due deliveries", "err", err)
		}
		return d.poll
	}
	for _, row := range rows {
		dec, recorded := d.deliver(ctx, w, row)
		if ctx.Err() != nil {
			return 0
		}
		if !recorded {
			continue
		}
		if dec.Disable {
			return d.poll
		}
		if dec.Status == StatusRetrying && (w.nextDue.IsZero() || dec.NextAttemptAt.Before(w.nextDue)) {
			w.nextDue = dec.NextAttemptAt
		}
		if dec.Pause > 0 {
			// The rest of the batch is claimed: hold it until the pause
			// ends rather than leave it to its lease.
			d.setPaused(w, true)
			if !sleep(ctx, dec.Pause) {
				return 0
			}
			d.setPaused(w, false)
		}
	}
	if len(rows) == d.batch {
		return 0
	}
	wait := d.poll
	if !w.nextDue.IsZero() {
		wait = min(wait, max(w.nextDue.Sub(d.now()), 0))
	}
	return wait
}

// deliver makes one attempt at row, records it with the policy's outcome
// and pauses or disables the target as the policy says. recorded is false
// when the attempt was cut short by ctx or could not be recorded; the row
// is then due again when its lease ends.
func (d *Dispatcher) deliver(ctx context.Context, w *worker, row Row) (dec Decision, recorded bool) {
	a, retryAfter, err := d.send(ctx, w.t, w.client, row, w.t.URL, row.Attempts+1, false)
	if err != nil && ctx.Err() != nil {
		return Decision{}, false
	}
	now := d.now()
	dec = Next(w.t.RetrySchedule, a.Attempt, a.StatusCode, retryAfter, err, now, d.rand())
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	id, rerr := d.q.RecordAttempt(rctx, a, Outcome{Status: dec.Status, NextAttemptAt: dec.NextAttemptAt})
	if rerr != nil {
		w.logger.Error("record attempt", "delivery", row.ID, "event_id", row.EventID, "err", rerr)
		return dec, false
	}
	a.ID = id
	d.metrics.attempts.WithLabelValues(w.t.Name, dec.Status).Inc()
	d.metrics.request.WithLabelValues(w.t.Name).Observe(a.Duration.Seconds())
	log := w.logger.With("delivery", row.ID, "event_id", row.EventID, "attempt", a.Attempt,
		"status", a.StatusCode, "request_id", a.RequestID, "outcome", dec.Status)
	switch dec.Status {
	case StatusDelivered:
		d.metrics.latency.WithLabelValues(w.t.Name).Observe(now.Sub(row.CreatedAt).Seconds())
		log.Debug("delivered")
	case StatusDeadLetter:
		d.metrics.deadLetters.WithLabelValues(w.t.Name).Inc()
		log.Warn("dead-lettered", "reason", dec.Reason, "err", a.Error)
	default:
		log.Info("will retry", "reason", dec.Reason, "next_attempt_at", dec.NextAttemptAt, "err", a.Error)
	}
	if dec.Pause > 0 {
		if err := d.q.PauseTarget(rctx, w.t.Name, now.Add(dec.Pause)); err != nil {
			w.logger.Error("pause target", "err", err)
		}
		w.logger.Info("target paused", "for", dec.Pause)
	}
	if dec.Disable {
		reason := fmt.Sprintf("%s from %s on %s", dec.Reason, a.URL, now.UTC().Format(time.RFC3339))
		if err := d.q.DisableTarget(rctx, w.t.Name, reason, now); err != nil {
			w.logger.Error("disable target", "err", err)
		}
		d.setDisabled(w, true)
		w.logger.Warn("target disabled", "reason", reason)
	}
	return dec, true
}

// Redirect sends row once, now, to rawURL instead of its target's URL,
// through the SSRF guard with the AllowPrivate setting of the row's
// target, and records it as a Redirect attempt, which leaves the
// delivery's status unchanged. It returns the recorded attempt. A non-2xx
// answer or a transport failure is not an error: the Attempt says what
// happened. It returns an error when the row's target is unknown, when the
// URL is refused (the refusal is still recorded, and wraps ErrRefused), or
// when the attempt cannot be recorded.
func (d *Dispatcher) Redirect(ctx context.Context, row Row, rawURL string) (Attempt, error) {
	w, ok := d.byName[row.Target]
	if !ok {
		return Attempt{}, fmt.Errorf("delivery: redirect %d: unknown target %q", row.ID, row.Target)
	}
	var (
		a       Attempt
		refused error
	)
	if err := checkURL(rawURL, w.t.AllowPrivate); err != nil {
		refused = err
		a = Attempt{DeliveryID: row.ID, Target: row.Target, URL: redactURL(rawURL), Attempt: row.Attempts + 1,
			Error: err.Error(), RequestID: uuid.NewString(), At: d.now(), Redirect: true}
	} else {
		var err error
		a, _, err = d.send(ctx, w.t, w.client, row, rawURL, row.Attempts+1, true)
		if err != nil && ctx.Err() != nil {
			return a, fmt.Errorf("delivery: redirect %d: %w", row.ID, ctx.Err())
		}
		var re *RefusedError
		if errors.As(err, &re) {
			refused = re
		}
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	id, err := d.q.RecordAttempt(rctx, a, Outcome{Status: row.Status, NextAttemptAt: row.NextAttemptAt})
	if err != nil {
		return a, fmt.Errorf("delivery: redirect %d: record attempt: %w", row.ID, err)
	}
	a.ID = id
	d.metrics.attempts.WithLabelValues(w.t.Name, "redirect").Inc()
	if refused != nil {
		return a, fmt.Errorf("delivery: redirect %d: %w", row.ID, refused)
	}
	return a, nil
}

// send POSTs row to rawURL once. It returns the attempt (not yet
// recorded), the answer's Retry-After header, and the transport error
// when no answer came (also in Attempt.Error).
func (d *Dispatcher) send(ctx context.Context, t Target, client *http.Client, row Row, rawURL string, attempt int, redirect bool) (Attempt, string, error) {
	body := cutPayload(row.Payload, t.MaxPayload)
	at := d.now()
	a := Attempt{
		DeliveryID: row.ID,
		Target:     row.Target,
		URL:        redactURL(rawURL),
		Attempt:    attempt,
		RequestID:  uuid.NewString(),
		At:         at,
		Redirect:   redirect,
	}
	fail := func(err error) (Attempt, string, error) {
		a.Error = describe(err)
		return a, "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rawURL, bytes.NewReader(body))
	if err != nil {
		return fail(err)
	}
	for k, v := range t.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "backstop")
	req.Header.Set(intake.HeaderWebhookID, row.EventID)
	req.Header.Set(intake.HeaderWebhookTimestamp, strconv.FormatInt(at.Unix(), 10))
	if t.Secret != "" {
		sig, err := intake.SignStandardWebhooks(t.Secret, row.EventID, at, body)
		if err != nil {
			return fail(err)
		}
		req.Header.Set(intake.HeaderWebhookSignature, sig)
	}
	req.Header.Set(HeaderEventID, row.EventID)
	req.Header.Set(HeaderEventType, row.EventType)
	req.Header.Set(HeaderDeliveryAttempt, strconv.Itoa(attempt))
	req.Header.Set(HeaderRequestID, a.RequestID)

	var ticket PaceTicket
	if p := d.pacers[t.Name]; p != nil && !redirect {
		// The target's own X-RateLimit-* answers pace its queue, so it
		// never has to answer 429.
		if ticket, err = p.Acquire(ctx); err != nil {
			return fail(err)
		}
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		a.Duration = time.Since(start)
		if ticket != nil {
			ticket.Abort()
		}
		return fail(err)
	}
	defer resp.Body.Close()
	if ticket != nil {
		ticket.Done(resp.StatusCode, resp.Header)
	}
	a.StatusCode = resp.StatusCode
	logged, _ := io.ReadAll(io.LimitReader(resp.Body, maxLoggedBody))
	a.Body = strings.ToValidUTF8(string(logged), "\uFFFD")
	_, _ = io.CopyN(io.Discard, resp.Body, maxDrainedBody)
	a.Duration = time.Since(start)
	return a, resp.Header.Get("Retry-After"), nil
}

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

// redactURL hides the password of a URL's user info.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	return u.Redacted()
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
