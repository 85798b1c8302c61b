// Package groupcommit gathers concurrent writes into one commit: while a
// commit runs, the items submitted meanwhile queue up and are written
// together by the next one, so N concurrent writers pay for about one
// transaction instead of N.
package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrClosed is returned by Submit once the writer is closed.
var ErrClosed = errors.New("groupcommit: writer closed")

// DefaultMaxBatch is the MaxBatch of Options that set none.
const DefaultMaxBatch = 512

// CommitFunc writes items in one commit and returns one result per item,
// in the same order. An error means none of items was written.
type CommitFunc[T, R any] func(ctx context.Context, items []T) ([]R, error)

// Options configure a Writer. Zero fields take the defaults.
type Options struct {
	// MaxBatch caps the items per commit (default DefaultMaxBatch). 1
	// makes one commit per item.
	MaxBatch int
	// Linger, when positive, makes a batch smaller than the one before it
	// wait Linger, then take the items queued meanwhile, before it is
	// committed. Under steady load the callers the last commit answered
	// are about to submit again, and one commit for all of them costs
	// less than two (one fsync, one write of each page both would touch).
	// There is no wait after a batch that was not larger, so lone callers
	// wait for no one (but the first after a larger batch, Linger at
	// most); Close ends a wait at once.
	Linger time.Duration
	// Whole, when set, tells an error that fails a batch as a whole (the
	// store cannot commit at all, as while another process holds its
	// lock): every item gets it at once, rather than each being committed
	// again on its own, each waiting as long again; so do the items
	// queued while that commit ran.
	Whole func(err error) bool
	// Observe, when set, is told the size, duration and error of every
	// commit, including those of a failed batch's items retried one by
	// one. It is called from Run's goroutine.
	Observe func(size int, took time.Duration, err error)
}

// Writer is a group-commit writer: concurrent Submit calls are gathered
// into one batch per commit while the previous commit runs, and every
// caller is answered only after the commit that holds its item. A batch
// whose commit fails is committed again item by item, so one bad item
// cannot fail the others: each caller gets the error of its own item.
// A Writer is safe for concurrent use.
type Writer[T, R any] struct {
	commit   CommitFunc[T, R]
	maxBatch int
	linger   time.Duration
	whole    func(err error) bool
	observe  func(size int, took time.Duration, err error)
	// lingering, when set (tests), is called as a batch starts to linger.
	lingering func()

	in        chan *request[T, R]
	mu        sync.RWMutex // guards closed against sends on a closed channel
	closed    bool
	stopped   chan struct{}
	closing   chan struct{} // closed by Close
	runOnce   sync.Once
	closeOnce sync.Once
}

type request[T, R any] struct {
	item T
	done chan result[R]
}

type result[R any] struct {
	res R
	err error
}

// New returns a writer that commits with commit. Call Run to start it and
// Close to stop it.
func New[T, R any](commit CommitFunc[T, R], opts Options) *Writer[T, R] {
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = DefaultMaxBatch
	}
	return &Writer[T, R]{
		commit:   commit,
		maxBatch: opts.MaxBatch,
		linger:   opts.Linger,
		whole:    opts.Whole,
		observe:  opts.Observe,
		in:       make(chan *request[T, R], 4*opts.MaxBatch),
		stopped:  make(chan struct{}),
		closing:  make(chan struct{}),
	}
}

// Submit queues item and waits for the commit that holds it, and returns
// that item's result. It returns ErrClosed once Close was called. When ctx
// ends first, Submit returns ctx.Err(); an item already queued is still
// committed, so callers must make a repeat harmless.
func (w *Writer[T, R]) Submit(ctx context.Context, item T) (R, error) {
	var zero R
	req := &request[T, R]{item: item, done: make(chan result[R], 1)}
	w.mu.RLock()
	if w.closed {
		w.mu.RUnlock()
		return zero, ErrClosed
	}
	select {
	case w.in <- req:
		w.mu.RUnlock()
	case <-ctx.Done():
		w.mu.RUnlock()
		return zero, ctx.Err()
	}
	select {
	case r := <-req.done:
		return r.res, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// Run commits batches until Close is called and every queued item is
// committed; later calls return at once. ctx is passed to the commits
// only: cancelling it fails the batches in progress rather than dropping
// them silently.
func (w *Writer[T, R]) Run(ctx context.Context) {
	w.runOnce.Do(func() {
		defer close(w.stopped)
		batch := make([]*request[T, R], 0, w.maxBatch)
		prev := 0 // the size of the batch before
		for first := range w.in {
			batch = w.gather(append(batch[:0], first))
			if len(batch) < prev && w.linger > 0 {
				batch = w.wait(batch)
			}
			prev = len(batch)
			w.write(ctx, batch)
			clear(batch) // let the answered requests go
		}
	})
}

// gather adds the items queued meanwhile to batch, up to MaxBatch.
func (w *Writer[T, R]) gather(batch []*request[T, R]) []*request[T, R] {
	for len(batch) < w.maxBatch {
		select {
		case req, ok := <-w.in:
			if !ok {
				return batch
			}
			batch = append(batch, req)
		default:
			return batch
		}
	}
	return batch
}

// wait lets batch linger: it waits Linger (or until the writer is
// closed), then adds the items queued meanwhile.
func (w *Writer[T, R]) wait(batch []*request[T, R]) []*request[T, R] {
	if w.lingering != nil {
		w.lingering()
	}
	timer := time.NewTimer(w.linger)
	select {
	case <-timer.C:
	case <-w.closing:
		timer.Stop()
	}
	return w.gather(batch)
}

// Close stops accepting items and waits until Run has committed every item
// already queued, or ctx ends (then it returns ctx.Err()).
func (w *Writer[T, R]) Close(ctx context.Context) error {
	w.closeOnce.Do(func() {
		w.mu.Lock()
		w.closed = true
		close(w.closing)
		close(w.in)
		w.mu.Unlock()
	})
	select {
	case <-w.stopped:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// write commits batch and answers its requests. When the batch fails as a
// whole, each item is committed on its own.
func (w *Writer[T, R]) write(ctx context.Context, batch []*request[T, R]) {
	items := make([]T, len(batch))
	for i, req := range batch {
		items[i] = req.item
	}
	start := time.Now()
	results, err := w.commit(ctx, items)
	if err == nil && len(results) != len(batch) {
		err = fmt.Errorf("groupcommit: commit returned %d results for %d items", len(results), len(batch))
	}
	if w.observe != nil {
		w.observe(len(batch), time.Since(start), err)
	}
	if err == nil {
		for i, req := range batch {
			req.done <- result[R]{res: results[i]}
		}
		return
	}
	if w.whole != nil && w.whole(err) {
		for _, req := range batch {
			req.done <- result[R]{err: err}
		}
		w.failQueued(err)
		return
	}
	if len(batch) == 1 {
		batch[0].done <- result[R]{err: err}
		return
	}
	for _, req := range batch {
		w.write(ctx, []*request[T, R]{req})
	}
}

// failQueued answers the items queued when it is called with err, a Whole
// error that held while they queued: a commit of their own would wait as
// long again (behind a lock held elsewhere, the whole busy timeout) for the
// same answer, most likely. Items submitted after it is called get a
// commit of their own.
func (w *Writer[T, R]) failQueued(err error) {
	for range len(w.in) {
		select {
		case req, ok := <-w.in:
			if !ok {
				return
			}
			req.done <- result[R]{err: err}
		default:
			return
		}
	}
}
