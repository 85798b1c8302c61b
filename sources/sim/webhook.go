package sim

import (
	"bytes"
	"context"
	"crypto/hmac"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/backstop-sync/backstop"
)

// Webhook defaults applied by New to zero Options fields.
const (
	DefaultWebhookWorkers = 8
	DefaultWebhookTimeout = 10 * time.Second
	DefaultTruncateOver   = 64 << 10
)

// MaxReorderDelay is the most later events a reordered event waits for
// before it is queued (see Options.ReorderRate).
const MaxReorderDelay = 5

// The headers of a webhook delivery.
const (
	SignatureHeader = "X-Botix-Signature"  // lowercase hex HMAC-SHA256 of the raw body
	EventIDHeader   = "X-Event-Id"         // the envelope's event_id
	EventTypeHeader = "X-Event-Type"       // the envelope's event
	AttemptHeader   = "X-Delivery-Attempt" // 1 for the first attempt of a delivery, 2 for its first retry, …
	RequestIDHeader = "X-Request-Id"       // new for every attempt
)

// ErrWebhooksStopped is returned by WebhooksIdle when the context given to
// StartWebhooks is done while webhooks are still pending.
var ErrWebhooksStopped = errors.New("sim: webhooks stopped")

// DefaultRetrySchedule returns the platform's retry schedule: retries 1
// minute, 10 minutes, 1 hour and 24 hours after each failed attempt.
func DefaultRetrySchedule() []time.Duration {
	return []time.Duration{time.Minute, 10 * time.Minute, time.Hour, 24 * time.Hour}
}

// Sign returns the X-Botix-Signature of body: the lowercase hex
// HMAC-SHA256 of the raw bytes keyed with secret.
func Sign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// SentEvent is one webhook event the Sim generated, whatever became of it.
type SentEvent struct {
	ID        string // event_id
	Type      string // e.g. "payment.succeeded"
	Resource  backstop.Resource
	ObjectID  string
	UpdatedAt time.Time // the version the event announces
	CreatedAt time.Time // the envelope's created_at
	// Body is the exact envelope sent (or that would have been sent, for a
	// dropped event). It is shared with the Sim and must not be modified.
	Body []byte
	// Truncated is true when Body carries only the object's id.
	Truncated bool
	// Dropped events were never sent; Duplicated ones were queued as two
	// deliveries; Reordered ones were held back behind later events.
	Dropped, Duplicated, Reordered bool
	// Delivered is true once any attempt of any of the event's deliveries
	// was answered with a 2xx.
	Delivered bool
}

// WebhookAttempt is one HTTP attempt of one delivery.
type WebhookAttempt struct {
	EventID   string
	Type      string
	ObjectID  string
	UpdatedAt time.Time
	// Attempt is 1 for a delivery's first attempt, 2 for its first retry, ….
	Attempt int
	// Status is the receiver's HTTP status, 0 when the attempt failed in
	// transport (Err says why).
	Status int
	Err    string
	// Duplicate is true for the second delivery of a duplicated event.
	Duplicate bool
	RequestID string
	// At is when the attempt was sent, by Options.Now.
	At time.Time
}

// WebhookWarnEvery is how often at most Options.Logger is told of failed
// webhook attempts.
const WebhookWarnEvery = 10 * time.Second

// WebhookStats counts the Sim's webhook traffic.
type WebhookStats struct {
	Events     int // distinct events generated, dropped ones included
	Dropped    int // events never sent
	Duplicated int // events queued as two deliveries
	Reordered  int // events held back behind later events
	Attempts   int // HTTP attempts made
	Delivered  int // events with at least one attempt answered 2xx
	Retries    int // attempts after a delivery's first
	GaveUp     int // deliveries (not events) abandoned after the last retry failed
}

// webhooks is the Sim's webhook sender: the events made, a FIFO queue of
// deliveries, the held-back (reordered) deliveries and the retry timers.
type webhooks struct {
	url          string
	secret       string
	drop, dup    float64
	reorder      float64
	schedule     []time.Duration
	workers      int
	truncateOver int
	now          func() time.Time
	client       *http.Client
	transport    *http.Transport
	rng          *rand.Rand // decisions; guarded by Sim.mu, under which events are made

	logger *slog.Logger

	mu      sync.Mutex // guards the fields below
	started bool
	// failed counts the attempts not answered 2xx since the last warning,
	// warned when it was (see Options.Logger).
	failed      int
	warned      time.Time
	stopped     bool
	events      []*SentEvent
	queue       []*delivery
	held        []*heldEvent
	timers      map[*time.Timer]struct{}
	outstanding int           // deliveries held, queued, in flight or waiting for a retry
	idle        chan struct{} // closed when outstanding reaches 0 or the sender stops
	log         []WebhookAttempt
	stats       WebhookStats
	wg          sync.WaitGroup // workers

	ready chan struct{} // capacity 1: the queue may be non-empty
}

// delivery is one copy of an event on its way to the receiver.
type delivery struct {
	ev      *SentEvent
	dup     bool
	attempt int // the number of the next attempt, from 1
}

// heldEvent is a reordered event's deliveries waiting for wait more events.
type heldEvent struct {
	ds   []*delivery
	wait int
}

func (o Options) validateWebhooks() error {
	if o.WebhookURL != "" {
		u, err := url.Parse(o.WebhookURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("sim: webhook url %q: want an absolute http or https URL", o.WebhookURL)
		}
	}
	for _, r := range []struct {
		name string
		f    float64
	}{{"drop", o.DropRate}, {"duplicate", o.DuplicateRate}, {"reorder", o.ReorderRate}} {
		if !(r.f >= 0 && r.f <= 1) { // NaN too
			return fmt.Errorf("sim: %s rate %g: want 0..1", r.name, r.f)
		}
	}
	for _, d := range o.RetrySchedule {
		if d < 0 {
			return fmt.Errorf("sim: retry schedule %v: waits must not be negative", o.RetrySchedule)
		}
	}
	switch {
	case o.WebhookWorkers < 0:
		return fmt.Errorf("sim: webhook workers %d: must not be negative", o.WebhookWorkers)
	case o.WebhookTimeout < 0:
		return fmt.Errorf("sim: webhook timeout %s: must not be negative", o.WebhookTimeout)
	case o.TruncateOver < 0:
		return fmt.Errorf("sim: truncate over %d: must not be negative", o.TruncateOver)
	}
	return nil
}

func newWebhooks(o Options) *webhooks {
	w := &webhooks{
		url:          o.WebhookURL,
		secret:       o.WebhookSecret,
		drop:         o.DropRate,
		dup:          o.DuplicateRate,
		reorder:      o.ReorderRate,
		schedule:     append([]time.Duration(nil), o.RetrySchedule...),
		workers:      o.WebhookWorkers,
		truncateOver: o.TruncateOver,
		logger:       o.Logger,
		rng:          rand.New(rand.NewPCG(uint64(o.Seed), 0x776562686f6f6b)),
		timers:       make(map[*time.Timer]struct{}),
		ready:        make(chan struct{}, 1),
	}
	if o.RetrySchedule == nil {
		w.schedule = DefaultRetrySchedule()
	}
	if w.workers == 0 {
		w.workers = DefaultWebhookWorkers
	}
	if w.truncateOver == 0 {
		w.truncateOver = DefaultTruncateOver
	}
	timeout := o.WebhookTimeout
	if timeout == 0 {
		timeout = DefaultWebhookTimeout
	}
	w.transport = http.DefaultTransport.(*http.Transport).Clone()
	w.transport.MaxIdleConnsPerHost = w.workers
	w.client = &http.Client{
		Transport: w.transport,
		Timeout:   timeout,
		// The platform does not follow redirects: a 3xx is a failure.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return w
}

// eventType names the event announcing rec, a new object when created.
func eventType(rec *record, created bool) string {
	switch v := rec.v.(type) {
	case contact:
		if created {
			return "contact.created"
		}
		return "contact.updated"
	case chat:
		// A new chat may start closed: its webhook names the state its
		// data shows, as backstop.EventTypeFor does.
		return "chat." + v.Status
	case message:
		if created {
			return "message.created"
		}
		return "message.updated"
	case payment:
		return "payment." + v.Status
	}
	panic(fmt.Sprintf("sim: unknown object %T", rec.v))
}

// randomID returns prefix and 24 random hex digits.
func randomID(prefix string) string {
	var b [12]byte
	_, _ = crand.Read(b[:]) // never fails
	return prefix + hex.EncodeToString(b[:])
}

// envelope returns the webhook body announcing rec and whether it had to be
// truncated to stay within limit bytes.
func envelope(id, typ string, rec *record, limit int) ([]byte, bool) {
	created := formatTS(rec.ts)
	head := len(`{"event_id":"","event":"","created_at":"","data":}`) + len(id) + len(typ) + len(created)
	data, trunc := rec.data, false
	if head+len(data) > limit {
		data, trunc = []byte(`{"id":"`+rec.id+`"}`), true
	}
	b := make([]byte, 0, head+len(data)+len(`,"truncated":true`))
	b = append(b, `{"event_id":"`...)
	b = append(b, id...)
	b = append(b, `","event":"`...)
	b = append(b, typ...)
	b = append(b, `","created_at":"`...)
	b = append(b, created...)
	b = append(b, `","data":`...)
	b = append(b, data...)
	if trunc {
		b = append(b, `,"truncated":true`...)
	}
	return append(b, '}'), trunc
}

// event makes the webhook event of a new version and queues its
// deliveries, deciding from the seeded source whether it is dropped,
// duplicated or reordered. The caller holds Sim.mu.
func (w *webhooks) event(r backstop.Resource, rec *record, created bool) {
	// Four draws per event, whatever the rates, so decisions depend only
	// on the seed and the sequence of mutations.
	fDrop, fDup, fReorder := w.rng.Float64(), w.rng.Float64(), w.rng.Float64()
	wait := 1 + w.rng.IntN(MaxReorderDelay)

	id, typ := randomID("evt_"), eventType(rec, created)
	body, trunc := envelope(id, typ, rec, w.truncateOver)
	ts := time.Unix(0, rec.ts).UTC()
	ev := &SentEvent{
		ID: id, Type: typ, Resource: r, ObjectID: rec.id, UpdatedAt: ts, CreatedAt: ts,
		Body: body, Truncated: trunc,
		Dropped: fDrop < w.drop,
	}
	if !ev.Dropped {
		ev.Duplicated = fDup < w.dup
		ev.Reordered = fReorder < w.reorder
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	w.events = append(w.events, ev)
	w.stats.Events++
	if ev.Dropped {
		w.stats.Dropped++
		return
	}
	ds := []*delivery{{ev: ev, attempt: 1}}
	if ev.Duplicated {
		w.stats.Duplicated++
		ds = append(ds, &delivery{ev: ev, dup: true, attempt: 1})
	}
	w.outstanding += len(ds)
	if ev.Reordered {
		w.stats.Reordered++
		w.held = append(w.held, &heldEvent{ds: ds, wait: wait})
		return
	}
	w.push(ds...)
	// This event is one more that the held ones were waiting for.
	kept := w.held[:0]
	for _, h := range w.held {
		if h.wait--; h.wait <= 0 {
			w.push(h.ds...)
			continue
		}
		kept = append(kept, h)
	}
	clear(w.held[len(kept):])
	w.held = kept
}

// push queues deliveries and wakes a worker. The caller holds mu.
func (w *webhooks) push(ds ...*delivery) {
	if w.stopped {
		return
	}
	w.queue = append(w.queue, ds...)
	select {
	case w.ready <- struct{}{}:
	default:
	}
}

// flush queues every held event. The caller holds mu.
func (w *webhooks) flush() {
	for _, h := range w.held {
		w.push(h.ds...)
	}
	clear(w.held)
	w.held = w.held[:0]
}

// done retires one delivery. The caller holds mu.
func (w *webhooks) done() {
	w.outstanding--
	if w.outstanding == 0 && w.idle != nil {
		close(w.idle)
		w.idle = nil
	}
}

// StartWebhooks starts sending the queued webhook events and those of
// later mutations, with Options.WebhookWorkers concurrent senders, until
// ctx is done; then nothing more is sent or retried. Events made before
// it is called wait in the queue. Only the first call has an effect; Run
// and Serve call it too. Without a WebhookURL it does nothing.
func (s *Sim) StartWebhooks(ctx context.Context) { s.startWebhooks(ctx) }

// startWebhooks reports whether this call started the sender.
func (s *Sim) startWebhooks(ctx context.Context) bool {
	w := s.wh
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return false
	}
	w.started = true
	for range w.workers {
		w.wg.Go(func() { w.work(ctx) })
	}
	w.wg.Go(func() {
		<-ctx.Done()
		w.stop()
	})
	return true
}

// waitWebhooks waits for the workers started by startWebhooks to return.
func (s *Sim) waitWebhooks() {
	if s.wh != nil {
		s.wh.wg.Wait()
	}
}

// stop abandons whatever is pending: retry timers are stopped, queued and
// held deliveries dropped, and waiters woken.
func (w *webhooks) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	for t := range w.timers {
		t.Stop()
	}
	clear(w.timers)
	w.queue, w.held = nil, nil
	if w.idle != nil {
		close(w.idle)
		w.idle = nil
	}
	w.transport.CloseIdleConnections()
}

// work sends queued deliveries until ctx is done.
func (w *webhooks) work(ctx context.Context) {
	for {
		w.mu.Lock()
		var d *delivery
		if len(w.queue) > 0 {
			d = w.queue[0]
			w.queue[0] = nil
			w.queue = w.queue[1:]
			if len(w.queue) > 0 { // pass the wake-up on
				select {
				case w.ready <- struct{}{}:
				default:
				}
			}
		}
		w.mu.Unlock()
		if d == nil {
			select {
			case <-w.ready:
				continue
			case <-ctx.Done():
				return
			}
		}
		w.send(ctx, d)
	}
}

// send makes one attempt of d, records it and retires d or schedules its
// retry.
func (w *webhooks) send(ctx context.Context, d *delivery) {
	a := WebhookAttempt{
		EventID: d.ev.ID, Type: d.ev.Type, ObjectID: d.ev.ObjectID, UpdatedAt: d.ev.UpdatedAt,
		Attempt: d.attempt, Duplicate: d.dup, RequestID: randomID("req_"), At: w.now(),
	}
	status, err := w.post(ctx, d, a.RequestID)
	a.Status = status
	if err != nil {
		a.Err = err.Error()
	}
	ok := err == nil && status >= 200 && status < 300

	var warn []any // logged once the lock is released
	defer func() {
		if warn != nil {
			w.logger.Warn("webhook not accepted", warn...)
		}
	}()
	w.mu.Lock()
	defer w.mu.Unlock()
	if !ok && w.logger != nil {
		w.failed++
		if now := time.Now(); now.Sub(w.warned) >= WebhookWarnEvery {
			warn = []any{"url", w.url, "event_id", a.EventID, "attempt", a.Attempt, "status", a.Status, "failed_since_last_warning", w.failed}
			if a.Err != "" {
				warn = append(warn, "error", a.Err)
			}
			w.failed, w.warned = 0, now
		}
	}
	w.log = append(w.log, a)
	w.stats.Attempts++
	if d.attempt > 1 {
		w.stats.Retries++
	}
	switch {
	case ok:
		if !d.ev.Delivered {
			d.ev.Delivered = true
			w.stats.Delivered++
		}
		w.done()
	case w.stopped:
		// Abandoned with everything else.
	case d.attempt <= len(w.schedule):
		wait := w.schedule[d.attempt-1]
		d.attempt++
		var t *time.Timer
		t = time.AfterFunc(wait, func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if _, ok := w.timers[t]; ok {
				delete(w.timers, t)
				w.push(d)
			}
		})
		w.timers[t] = struct{}{}
	default:
		w.stats.GaveUp++
		w.done()
	}
}

// post sends one attempt and returns the receiver's status.
func (w *webhooks) post(ctx context.Context, d *delivery, requestID string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(d.ev.Body))
	if err != nil {
		return 0, fmt.Errorf("webhook request: %w", err)
	}
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set(SignatureHeader, Sign(w.secret, d.ev.Body))
	h.Set(EventIDHeader, d.ev.ID)
	h.Set(EventTypeHeader, d.ev.Type)
	h.Set(AttemptHeader, strconv.Itoa(d.attempt))
	h.Set(RequestIDHeader, requestID)
	resp, err := w.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("webhook post: %w", err)
	}
	// Drain a little so the connection can be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// WebhooksIdle waits until every webhook event made so far is delivered or
// given up: nothing queued, in flight or waiting for a retry. Events held
// back for reordering are queued at once, since no later event may come.
// It returns ctx's error when ctx is done first, and ErrWebhooksStopped
// when the sender stops with webhooks pending. Without a WebhookURL it
// returns nil at once. Before StartWebhooks nothing is sent, so it waits.
func (s *Sim) WebhooksIdle(ctx context.Context) error {
	w := s.wh
	if w == nil {
		return nil
	}
	for {
		w.mu.Lock()
		w.flush()
		switch {
		case w.outstanding == 0:
			w.mu.Unlock()
			return nil
		case w.stopped:
			w.mu.Unlock()
			return ErrWebhooksStopped
		}
		if w.idle == nil {
			w.idle = make(chan struct{})
		}
		idle := w.idle
		w.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return fmt.Errorf("sim: webhooks idle: %w", ctx.Err())
		}
	}
}

// WebhookLog returns every webhook attempt made so far, in the order their
// outcomes were known.
func (s *Sim) WebhookLog() []WebhookAttempt {
	if s.wh == nil {
		return nil
	}
	s.wh.mu.Lock()
	defer s.wh.mu.Unlock()
	return append([]WebhookAttempt(nil), s.wh.log...)
}

// WebhookStats returns a snapshot of the webhook counters.
func (s *Sim) WebhookStats() WebhookStats {
	if s.wh == nil {
		return WebhookStats{}
	}
	s.wh.mu.Lock()
	defer s.wh.mu.Unlock()
	return s.wh.stats
}

// Events returns every webhook event made so far, in the order of the
// mutations, dropped ones included.
func (s *Sim) Events() []SentEvent {
	if s.wh == nil {
		return nil
	}
	s.wh.mu.Lock()
	defer s.wh.mu.Unlock()
	out := make([]SentEvent, len(s.wh.events))
	for i, ev := range s.wh.events {
		out[i] = *ev
	}
	return out
}
