package intake

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/backstop-sync/backstop"
)

// TruncatedStore is what the fetcher needs from the store.
type TruncatedStore interface {
	ClaimTruncated(ctx context.Context, now time.Time, limit int, lease time.Duration) ([]backstop.Event, error)
	CompleteTruncated(ctx context.Context, eventID string, obj backstop.Object, routes []backstop.Route) (backstop.EmitResult, error)
	FailClaimedTruncated(ctx context.Context, eventID string, lease time.Time, errMsg string, next func(attempts int) time.Time) (int, error)
	ReleaseTruncated(ctx context.Context, eventID string, lease, due time.Time) (bool, error)
	AbandonTruncated(ctx context.Context, eventID string, errMsg string) error
	CountTruncatedPending(ctx context.Context) (int, error)
}

// DefaultNotFoundGrace is FetcherOptions.NotFoundGrace's default.
const DefaultNotFoundGrace = time.Hour

// DefaultFetchLease is FetcherOptions.Lease's default.
const DefaultFetchLease = 5 * time.Minute

// Fetcher completes truncated events: it fetches each one's object through
// the governed API client and finishes the event (mirror, outbox) in the
// store. A failed fetch is retried with exponential backoff, logged and
// counted. An event whose object the platform still says does not exist
// (404) once it is NotFoundGrace old is given up (see
// FetcherOptions.NotFoundGrace), and so at once is one whose object it says
// is deleted (410 Gone); other failures are retried for as long as they
// last.
//
// Fetchers of several processes may share one store: each event is claimed
// for one fetch at a time (see FetcherOptions.Lease), and the backoff
// follows the attempts stored with the event, so every process, and one
// restarted, keeps to the one schedule.
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
	lease    time.Duration
	workers  int
	wake     chan struct{}
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
	// NotFoundGrace is how long after its created_at (the store gives the
	// time it arrived instead when created_at is later) an event's object may
	// still be missing from the API (a webhook can come before the object
	// can be read) before a 404 gives the event up (default 1h): it is
	// logged, counted as result "gave_up", and left unmirrored and
	// unqueued; a reconcile emits the object should it appear later.
	NotFoundGrace time.Duration
	// Lease is how long a fetcher holds an event it claimed (default 5m):
	// no other fetcher of the store fetches it meanwhile, and should the
	// process die mid-fetch, the event is due again when the lease ends.
	// The fetch itself is given four fifths of it, the rest is left to
	// record the outcome; a fetch that takes longer fails and is retried.
	Lease time.Duration
	// OnQueued, when set, is told the targets a completed event was
	// queued for (see BatcherOptions.OnQueued).
	OnQueued func(target string)
	// Concurrency is how many events are fetched at once (default
	// DefaultFetchConcurrency), so that an object whose fetch hangs until
	// its timeout holds up no other. Every fetch goes through the
	// governed client, which keeps them all within the API's limit.
	Concurrency int
}

// DefaultFetchConcurrency is FetcherOptions.Concurrency's default.
const DefaultFetchConcurrency = 4

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
	if opts.Lease <= 0 {
		opts.Lease = DefaultFetchLease
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultFetchConcurrency
	}
	return &Fetcher{
		store: st, source: src, routes: opts.Routes, metrics: opts.Metrics, logger: opts.Logger, onQueued: opts.OnQueued,
		now: opts.Now, interval: opts.Interval, minRetry: opts.MinRetry, maxRetry: opts.MaxRetry, grace: opts.NotFoundGrace,
		lease: opts.Lease, workers: opts.Concurrency, wake: make(chan struct{}, 1),
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

// Run fetches due events, Concurrency at a time, until ctx is done, and
// returns once every fetch has stopped.
func (f *Fetcher) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for i := range f.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.work(ctx, i == 0)
		}()
	}
	wg.Wait()
}

// work is one of Run's workers: it fetches due events one after another
// until none is left, then waits to be woken or for the next interval.
// A Wake reaches one idle worker, or the first to finish its fetch; a
// worker that claims an event wakes another, so that a burst is shared
// out at once. The first worker (counts) keeps the pending gauge.
func (f *Fetcher) work(ctx context.Context, counts bool) {
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for {
		f.drain(ctx, counts)
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
		case <-t.C:
		}
	}
}

// drain fetches every due event, claiming one at a time so that each
// fetch starts well within its lease and the fetchers of other processes
// share the work.
func (f *Fetcher) drain(ctx context.Context, counts bool) {
	for ctx.Err() == nil {
		now := f.now()
		due, err := f.store.ClaimTruncated(ctx, now, 1, f.lease)
		if err != nil {
			if ctx.Err() == nil {
				f.logger.Error("claim truncated events", "error", err)
			}
			break
		}
		if len(due) == 0 {
			break
		}
		f.Wake() // more may be due: an idle worker looks
		f.fetch(ctx, due[0], now, now.Add(f.lease))
	}
	if counts && f.metrics != nil && ctx.Err() == nil {
		if n, err := f.store.CountTruncatedPending(ctx); err == nil {
			f.metrics.TruncatedPending.Set(float64(n))
		}
	}
}

// fetch fetches the object of ev, claimed at claimed until lease, and
// records the outcome.
func (f *Fetcher) fetch(ctx context.Context, ev backstop.Event, claimed, lease time.Time) {
	fetchCtx, cancel := context.WithTimeout(ctx, f.lease*4/5)
	obj, _, err := f.source.Get(fetchCtx, ev.Resource, ev.ObjectID)
	cancel()
	if ctx.Err() != nil {
		f.release(ev, claimed, lease)
		return
	}
	missing := errors.Is(err, backstop.ErrNotFound) // on the platform, not in the store
	// A 410: deleted for good, so no retry can fetch it, within
	// NotFoundGrace or after.
	gone := errors.Is(err, backstop.ErrGone)
	if err == nil {
		var res backstop.EmitResult
		res, err = f.store.CompleteTruncated(ctx, ev.ID, obj, f.routes)
		if err == nil {
			if f.onQueued != nil {
				backstop.QueuedTargets([]backstop.Event{ev}, []backstop.EmitResult{res}, f.routes, f.onQueued)
			}
			f.result("ok")
			f.logger.Info("truncated event completed", "event_id", ev.ID, "resource", ev.Resource,
				"object_id", ev.ObjectID, "status", res.Status)
			return
		}
		if ctx.Err() != nil {
			f.release(ev, claimed, lease)
			return
		}
	}
	if gone || (missing && f.now().Sub(ev.CreatedAt) >= f.grace) {
		// Counted and logged once stored: a failed write leaves the
		// event to be fetched (and given up) again.
		if aerr := f.store.AbandonTruncated(ctx, ev.ID, "given up: "+err.Error()); aerr != nil {
			if ctx.Err() == nil {
				f.logger.Error("record truncated event given up", "event_id", ev.ID, "error", aerr)
			}
			return
		}
		f.result("gave_up")
		f.logger.Error("truncated event given up: the platform has no such object", "event_id", ev.ID,
			"resource", ev.Resource, "object_id", ev.ObjectID, "event_created_at", ev.CreatedAt, "error", err)
		return
	}
	f.result("error")
	var wait time.Duration
	n, ferr := f.store.FailClaimedTruncated(ctx, ev.ID, lease, err.Error(), func(n int) time.Time {
		wait = min(f.minRetry<<min(n-1, 20), f.maxRetry)
		return f.now().Add(wait)
	})
	switch {
	case errors.Is(ferr, backstop.ErrNotFound):
		// The lease ran out during the fetch: another fetch has the
		// event now, and records its own outcome.
		f.logger.Warn("truncated event fetch failed after its claim ran out; not recorded", "event_id", ev.ID,
			"resource", ev.Resource, "object_id", ev.ObjectID, "error", err)
	case ferr != nil:
		if ctx.Err() == nil {
			f.logger.Error("record truncated fetch failure", "event_id", ev.ID, "error", ferr)
		}
	default:
		f.logger.Warn("truncated event fetch failed; will retry", "event_id", ev.ID, "resource", ev.Resource,
			"object_id", ev.ObjectID, "attempt", n, "retry_in", wait, "error", err)
	}
}

// release hands ev, claimed at claimed until lease, back unfetched as the
// fetcher stops, so that another process (or this one restarted) need not
// wait for the lease to end.
func (f *Fetcher) release(ev backstop.Event, claimed, lease time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := f.store.ReleaseTruncated(ctx, ev.ID, lease, claimed); err != nil {
		f.logger.Warn("release truncated event", "event_id", ev.ID, "error", err)
	}
}

func (f *Fetcher) result(r string) {
	if f.metrics != nil {
		f.metrics.TruncatedFetches.WithLabelValues(r).Inc()
	}
}
