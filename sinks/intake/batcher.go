package intake

import (
	"context"
	"errors"
	"log/slog"
	stdsync "sync"
	"time"

	"github.com/backstop-sync/backstop"
)

// ErrClosed is returned by Submit once the writer is closed.
var ErrClosed = errors.New("intake: writer closed")

// Batcher is the group-commit writer of the emit path: concurrent Submit
// calls are gathered into one batch per transaction while the previous
// transaction commits, and every caller is answered only after the commit
// that holds its event.
type Batcher struct {
	log      backstop.EventLog
	routes   []backstop.Route
	maxBatch int
	logger   *slog.Logger
	observe  func(size int, took time.Duration, err error)

	in       chan *submission
	mu       stdsync.RWMutex // guards closed against sends on a closed channel
	closed   bool
	stopped  chan struct{}
	runOnce  stdsync.Once
	closeOne stdsync.Once
}

type submission struct {
	ev   backstop.Event
	done chan submitResult
}

type submitResult struct {
	res backstop.EmitResult
	err error
}

// BatcherOptions configure a Batcher.
type BatcherOptions struct {
	// MaxBatch caps the events per transaction (default 512). 1 makes one
	// commit per request (the baseline the benchmark compares against).
	MaxBatch int
	// Routes are the delivery targets' subscriptions, for outbox rows.
	Routes []backstop.Route
	Logger *slog.Logger
	// Observe, when set, is told the size, duration and error of every commit.
	Observe func(size int, took time.Duration, err error)
}

// NewBatcher returns a writer over log. Call Run to start it.
func NewBatcher(log backstop.EventLog, opts BatcherOptions) *Batcher {
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 512
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Batcher{
		log:      log,
		routes:   opts.Routes,
		maxBatch: opts.MaxBatch,
		logger:   opts.Logger,
		observe:  opts.Observe,
		in:       make(chan *submission, 4*opts.MaxBatch),
		stopped:  make(chan struct{}),
	}
}

// Submit queues ev and waits for the commit that holds it. A nil error means
// the event is durable (accepted or a duplicate of a durable one). When ctx
// ends first, Submit returns ctx.Err(); the event may still be committed,
// which the dedup makes harmless when the sender retries.
func (b *Batcher) Submit(ctx context.Context, ev backstop.Event) (backstop.EmitResult, error) {
	s := &submission{ev: ev, done: make(chan submitResult, 1)}
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return backstop.EmitResult{}, ErrClosed
	}
	select {
	case b.in <- s:
		b.mu.RUnlock()
	case <-ctx.Done():
		b.mu.RUnlock()
		return backstop.EmitResult{}, ctx.Err()
	}
	select {
	case r := <-s.done:
		return r.res, r.err
	case <-ctx.Done():
		return backstop.EmitResult{}, ctx.Err()
	}
}

// Run commits batches until Close is called and every queued event is
// committed. ctx is used for the transactions only: cancelling it fails the
// batches in progress rather than dropping them silently.
func (b *Batcher) Run(ctx context.Context) {
	b.runOnce.Do(func() {
		defer close(b.stopped)
		batch := make([]*submission, 0, b.maxBatch)
		for first := range b.in {
			batch = append(batch[:0], first)
		drain:
			for len(batch) < b.maxBatch {
				select {
				case s, ok := <-b.in:
					if !ok {
						break drain
					}
					batch = append(batch, s)
				default:
					break drain
				}
			}
			b.commit(ctx, batch)
		}
	})
}

// Close stops accepting events and waits until Run has committed every event
// already queued (or ctx ends).
func (b *Batcher) Close(ctx context.Context) error {
	b.closeOne.Do(func() {
		b.mu.Lock()
		b.closed = true
		close(b.in)
		b.mu.Unlock()
	})
	select {
	case <-b.stopped:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// commit writes one batch. When the batch fails as a whole, each event is
// tried on its own so one bad event cannot fail the others.
func (b *Batcher) commit(ctx context.Context, batch []*submission) {
	events := make([]backstop.Event, len(batch))
	for i, s := range batch {
		events[i] = s.ev
	}
	start := time.Now()
	results, err := b.log.Emit(ctx, events, b.routes)
	if b.observe != nil {
		b.observe(len(batch), time.Since(start), err)
	}
	if err == nil && len(results) != len(batch) {
		err = errors.New("intake: emit returned a result count that does not match the batch")
	}
	if err == nil {
		for i, s := range batch {
			s.done <- submitResult{res: results[i]}
		}
		return
	}
	if len(batch) == 1 {
		b.logger.Error("commit failed", "event_id", batch[0].ev.ID, "error", err)
		batch[0].done <- submitResult{err: err}
		return
	}
	b.logger.Warn("batch commit failed; committing its events one by one", "size", len(batch), "error", err)
	for _, s := range batch {
		b.commit(ctx, []*submission{s})
	}
}
