package intake

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/internal/groupcommit"
)

// ErrClosed is returned by Submit once the writer is closed.
var ErrClosed = errors.New("intake: writer closed")

// Batcher is the group-commit writer of the emit path: concurrent Submit
// calls are gathered into one batch per transaction while the previous
// transaction commits, and every caller is answered only after the commit
// that holds its event. A batch that fails is committed again event by
// event, so one bad event cannot fail the others.
type Batcher struct {
	w *groupcommit.Writer[backstop.Event, backstop.EmitResult]
}

// BatcherOptions configure a Batcher.
type BatcherOptions struct {
	// MaxBatch caps the events per transaction (default 512). 1 makes one
	// commit per request (the baseline the benchmark compares against).
	MaxBatch int
	// Linger is how long a batch smaller than the one before waits for
	// more events to join it (see groupcommit.Options); 0 commits at once.
	Linger time.Duration
	// Whole, when set, tells a commit error every event of the batch
	// shares (a lock held elsewhere): they all get it at once instead of
	// being committed again one by one (see groupcommit.Options).
	Whole func(err error) bool
	// Routes are the delivery targets' subscriptions, for outbox rows.
	Routes []backstop.Route
	Logger *slog.Logger
	// Observe, when set, is told the size, duration and error of every commit.
	Observe func(size int, took time.Duration, err error)
	// OnQueued, when set, is told after each commit the name of every
	// target that commit queued an outbox row for (once per commit), so
	// that delivery starts at once rather than at its next poll.
	OnQueued func(target string)
}

// NewBatcher returns a writer over log. Call Run to start it.
func NewBatcher(log backstop.EventLog, opts BatcherOptions) *Batcher {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	routes := opts.Routes
	emit := func(ctx context.Context, events []backstop.Event) ([]backstop.EmitResult, error) {
		results, err := log.Emit(ctx, events, routes)
		switch {
		case err == nil:
			if opts.OnQueued != nil && len(results) == len(events) {
				backstop.QueuedTargets(events, results, routes, opts.OnQueued)
			}
		case len(events) == 1:
			// The caller logs it (Handler, at most once a second): a
			// line here too would be a second one per request.
		default:
			logger.Warn("batch commit failed; committing its events one by one", "size", len(events), "error", err)
		}
		return results, err
	}
	return &Batcher{w: groupcommit.New(emit, groupcommit.Options{MaxBatch: opts.MaxBatch, Linger: opts.Linger, Whole: opts.Whole, Observe: opts.Observe})}
}

// Submit queues ev and waits for the commit that holds it. A nil error means
// the event is durable (accepted or a duplicate of a durable one). It returns
// ErrClosed once the writer is closed. When ctx ends first, Submit returns
// ctx.Err(); the event may still be committed, which the dedup makes harmless
// when the sender retries.
func (b *Batcher) Submit(ctx context.Context, ev backstop.Event) (backstop.EmitResult, error) {
	res, err := b.w.Submit(ctx, ev)
	if errors.Is(err, groupcommit.ErrClosed) {
		return res, ErrClosed
	}
	return res, err
}

// Run commits batches until Close is called and every queued event is
// committed. ctx is used for the transactions only: cancelling it fails the
// batches in progress rather than dropping them silently.
func (b *Batcher) Run(ctx context.Context) { b.w.Run(ctx) }

// Close stops accepting events and waits until Run has committed every event
// already queued (or ctx ends).
func (b *Batcher) Close(ctx context.Context) error { return b.w.Close(ctx) }
