package intake

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/backstop-sync/backstop"
)

// TruncatedStore is what the fetcher needs from the store.
type TruncatedStore interface {
	DueTruncated(ctx context.Context, now time.Time, limit int) ([]backstop.Event, error)
	CompleteTruncated(ctx context.Context, eventID string, obj backstop.Object, routes []backstop.Route) (backstop.EmitResult, error)
	FailTruncated(ctx context.Context, eventID string, errMsg string, next time.Time) error
	AbandonTruncated(ctx context.Context, eventID string, errMsg string) error
	CountTruncatedPending(ctx context.Context) (int, error)
}

// DefaultNotFoundGrace is FetcherOptions.NotFoundGrace's default.
const DefaultNotFoundGrace = time.Hour

// Fetcher completes truncated events: it fetches each one's object through
// the governed API client and finishes the event (mirror, outbox) in the
// store. A failed fetch is retried with exponential backoff, logged and
// counted. An event whose object the platform still says does not exist
// (404) once it is NotFoundGrace old is given up (see
// FetcherOptions.NotFoundGrace); other failures are retried for as long as
// they last.
type Fetcher struct {
	store    TruncatedStore
	source   backstop.Source
	routes   []backstop.Route
	metrics  *Metrics
	logger   *slog.Logger
	now      func() time.Time
	interval time.Duration
	minRetry time.Duration
	maxRetry time.Duration
	grace    time.Duration
	wake     chan struct{}
	attempts map[string]int
	onQueued func(target string)
}

// FetcherOptions configure a Fetcher.
type FetcherOptions struct {
	Routes  []backstop.Route
	Metrics *Metrics
	Logger  *slog.Logger
	Now     func() time.Time
	// Interval is how often due retries are looked for (default 1s).
	Interval time.Duration
	// MinRetry and MaxRetry bound the retry backoff (default 1s and 5m).
	MinRetry, MaxRetry time.Duration
	// NotFoundGrace is how long after its created_at an event's object may
	// still be missing from the API (a webhook can come before the object
	// can be read) before a 404 gives the event up (default 1h): it is
	// logged, counted as result "gave_up", and left unmirrored and
	// unqueued; a reconcile emits the object should it appear later.
	NotFoundGrace time.Duration
	// OnQueued, when set, is told the targets a completed event was
	// queued for (see BatcherOptions.OnQueued).
	OnQueued func(target string)
}

// NewFetcher returns a fetcher; call Run to start it.
func NewFetcher(st TruncatedStore, src backstop.Source, opts FetcherOptions) *Fetcher {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	if opts.MinRetry <= 0 {
		opts.MinRetry = time.Second
	}
	if opts.MaxRetry <= 0 {
		opts.MaxRetry = 5 * time.Minute
	}
	if opts.NotFoundGrace <= 0 {
		opts.NotFoundGrace = DefaultNotFoundGrace
	}
	return &Fetcher{
		store: st, source: src, routes: opts.Routes, metrics: opts.Metrics, logger: opts.Logger, onQueued: opts.OnQueued,
		now: opts.Now, interval: opts.Interval, minRetry: opts.MinRetry, maxRetry: opts.MaxRetry, grace: opts.NotFoundGrace,
		wake: make(chan struct{}, 1), attempts: map[string]int{},
	}
}

// Wake asks the fetcher to look for work now (after a truncated event was
// accepted). It never blocks.
func (f *Fetcher) Wake() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Run fetches due events until ctx is done.
func (f *Fetcher) Run(ctx context.Context) {
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for {
		f.drain(ctx)
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
		case <-t.C:
		}
	}
}

// drain processes every due event, a batch at a time.
func (f *Fetcher) drain(ctx context.Context) {
	for ctx.Err() == nil {
		due, err := f.store.DueTruncated(ctx, f.now(), 50)
		if err != nil {
			if ctx.Err() == nil {
				f.logger.Error("list truncated events", "error", err)
			}
			return
		}
		for _, ev := range due {
			f.fetch(ctx, ev)
		}
		if f.metrics != nil {
			if n, err := f.store.CountTruncatedPending(ctx); err == nil {
				f.metrics.TruncatedPending.Set(float64(n))
			}
		}
		if len(due) < 50 {
			return
		}
	}
}

func (f *Fetcher) fetch(ctx context.Context, ev backstop.Event) {
	obj, _, err := f.source.Get(ctx, ev.Resource, ev.ObjectID)
	missing := errors.Is(err, backstop.ErrNotFound) // on the platform, not in the store
	if err == nil {
		var res backstop.EmitResult
		res, err = f.store.CompleteTruncated(ctx, ev.ID, obj, f.routes)
		if err == nil {
			if f.onQueued != nil {
				backstop.QueuedTargets([]backstop.Event{ev}, []backstop.EmitResult{res}, f.routes, f.onQueued)
			}
			delete(f.attempts, ev.ID)
			f.result("ok")
			f.logger.Info("truncated event completed", "event_id", ev.ID, "resource", ev.Resource,
				"object_id", ev.ObjectID, "status", res.Status)
			return
		}
	}
	if ctx.Err() != nil {
		return
	}
	if missing && f.now().Sub(ev.CreatedAt) >= f.grace {
		// Counted and logged once stored: a failed write leaves the
		// event to be fetched (and given up) again.
		if aerr := f.store.AbandonTruncated(ctx, ev.ID, "given up: "+err.Error()); aerr != nil {
			if ctx.Err() == nil {
				f.logger.Error("record truncated event given up", "event_id", ev.ID, "error", aerr)
			}
			return
		}
		delete(f.attempts, ev.ID)
		f.result("gave_up")
		f.logger.Error("truncated event given up: the platform has no such object", "event_id", ev.ID,
			"resource", ev.Resource, "object_id", ev.ObjectID, "event_created_at", ev.CreatedAt, "error", err)
		return
	}
	f.result("error")
	n := f.attempts[ev.ID] + 1
	f.attempts[ev.ID] = n
	wait := min(f.minRetry<<min(n-1, 20), f.maxRetry)
	next := f.now().Add(wait)
	f.logger.Warn("truncated event fetch failed; will retry", "event_id", ev.ID, "resource", ev.Resource,
		"object_id", ev.ObjectID, "attempt", n, "retry_in", wait, "error", err)
	if ferr := f.store.FailTruncated(ctx, ev.ID, err.Error(), next); ferr != nil && ctx.Err() == nil {
		f.logger.Error("record truncated fetch failure", "event_id", ev.ID, "error", ferr)
	}
}

func (f *Fetcher) result(r string) {
	if f.metrics != nil {
		f.metrics.TruncatedFetches.WithLabelValues(r).Inc()
	}
}
