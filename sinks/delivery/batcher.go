package delivery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

const (
	// maxRecordBatch is the most attempts one Queue.RecordAttempts call
	// records.
	maxRecordBatch = 512
	// fullRecordBatch is how many attempts make a batch worth committing
	// without waiting for more: the cost of a commit per attempt falls
	// steeply up to about that many, then little.
	fullRecordBatch = 128
	// recordQuiet is how long the batcher waits for the next attempt
	// before it commits what it has: while the workers send, attempts
	// come much more often than that; once they stop, the batch need not
	// wait for the whole linger.
	recordQuiet = time.Millisecond
)

// batcher records the attempts of all of a dispatcher's workers in
// batches: a worker hands each answered attempt over and sends on, and one
// goroutine commits what was handed over in one RecordAttempts call, then
// counts, logs and acknowledges each attempt. A batch is committed once
// attempts stop coming (none for recordQuiet), once it is large
// (fullRecordBatch), RecordLinger after its first attempt came at the
// latest, and at once while closing.
// The attempts handed over while a batch commits make up the next one.
//
// Each attempt's record must commit by its by, recordTimeout after its
// answer: the room its lease keeps for it (see Options.Lease), however
// long it waited behind other batches. A batch's commit is bounded by the
// earliest by in it, the same attempts retried one by one each by its own,
// and an attempt whose by has passed is given up (logged) without a try:
// its row stays leased and is due again when its lease ends.
//
// Handing over costs a worker one append under a lock: no goroutine, no
// channel and no context per attempt, and the one goroutine wakes once per
// batch, not once per attempt.
type batcher struct {
	d      *Dispatcher
	ctx    context.Context // the dispatcher's, without its cancellation
	linger time.Duration

	mu      sync.Mutex
	queued  []handedOver
	closing bool

	wake    chan struct{} // a token when the first attempt of a batch comes
	stop    chan struct{} // closed by close
	stopped chan struct{} // closed once every attempt handed over is done

	// failing counts, per target name, the failed attempts since its last
	// delivery, once one failed (see logOutcome): its first failure is a
	// warning, the next ones debug lines until it delivers again.
	failingMu sync.Mutex
	failing   map[string]int
}

// handedOver is one answered attempt waiting for its record.
type handedOver struct {
	w   *worker
	row Row
	a   Attempt
	dec Decision
	now time.Time // when the answer was decided on
	out Outcome
	by  time.Time // when its record is given up (the real clock)
	// recorded, when not nil, is closed once the record is done
	// (committed or given up).
	recorded chan struct{}
}

// errNoRoom is an attempt's record error once its by has passed.
var errNoRoom = errors.New("delivery: not recorded within the lease's room for it: its row is due again when its lease ends")

// newBatcher returns a batcher for d; start it with run.
func newBatcher(d *Dispatcher, linger time.Duration) *batcher {
	return &batcher{
		d:       d,
		linger:  linger,
		wake:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		stopped: make(chan struct{}),
		failing: make(map[string]int),
	}
}

// add hands h over for recording.
func (r *batcher) add(h handedOver) {
	r.mu.Lock()
	r.queued = append(r.queued, h)
	first := len(r.queued) == 1
	r.mu.Unlock()
	if first {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// close makes run commit what is handed over at once and return once
// nothing is left; nothing may be added after it.
func (r *batcher) close() {
	r.mu.Lock()
	r.closing = true
	r.mu.Unlock()
	close(r.stop)
}

// run commits the batches until close, then what is left, and returns.
func (r *batcher) run(ctx context.Context) {
	defer close(r.stopped)
	r.ctx = context.WithoutCancel(ctx)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var batch []handedOver
	for {
		r.mu.Lock()
		n, closing := len(r.queued), r.closing
		r.mu.Unlock()
		if n == 0 {
			if closing {
				return
			}
			select {
			case <-r.wake:
			case <-r.stop:
			}
			continue
		}
		if !closing {
			r.gather(timer, n)
		}
		r.mu.Lock()
		take := min(len(r.queued), maxRecordBatch)
		batch = append(batch[:0], r.queued[:take]...)
		rest := copy(r.queued, r.queued[take:])
		clear(r.queued[rest:])
		r.queued = r.queued[:rest]
		r.mu.Unlock()
		r.commit(batch)
		clear(batch) // let the recorded attempts go
	}
}

// gather waits while more attempts come, n of them being handed over
// already: it returns once a look every recordQuiet finds none came since
// the previous one, once fullRecordBatch are handed over, once the linger
// has passed since the first came, or once the batcher closes.
func (r *batcher) gather(timer *time.Timer, n int) {
	deadline := time.Now().Add(r.linger)
	for n < fullRecordBatch {
		wait := min(recordQuiet, time.Until(deadline))
		if wait <= 0 {
			return
		}
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-r.stop:
			timer.Stop()
			return
		}
		r.mu.Lock()
		more := len(r.queued)
		r.mu.Unlock()
		if more == n {
			return
		}
		n = more
	}
}

// commit records batch in one call, or each attempt on its own when the
// call fails, so that one attempt that cannot be recorded (its delivery
// was purged meanwhile, say) does not keep the others from their records.
func (r *batcher) commit(batch []handedOver) {
	now := time.Now()
	live := batch[:0]
	for _, h := range batch {
		if !now.Before(h.by) {
			r.done(h, 0, errNoRoom)
			continue
		}
		live = append(live, h)
	}
	batch = live
	if len(batch) == 0 {
		return
	}
	items := make([]AttemptRecord, len(batch))
	by := batch[0].by
	for i, h := range batch {
		items[i] = AttemptRecord{Attempt: h.a, Outcome: h.out}
		if h.by.Before(by) {
			by = h.by
		}
	}
	ids, err := r.record(items, by)
	if err == nil {
		for i, h := range batch {
			r.done(h, ids[i], nil)
		}
		return
	}
	if len(batch) == 1 {
		r.done(batch[0], 0, err)
		return
	}
	for i, h := range batch {
		ids, err := r.record(items[i:i+1], h.by)
		var id int64
		if err == nil {
			id = ids[0]
		}
		r.done(h, id, err)
	}
}

// record records items by by at the latest; it fails with errNoRoom once
// by has passed.
func (r *batcher) record(items []AttemptRecord, by time.Time) ([]int64, error) {
	if !time.Now().Before(by) {
		return nil, errNoRoom
	}
	ctx, cancel := context.WithDeadline(r.ctx, by)
	defer cancel()
	ids, err := r.d.q.RecordAttempts(ctx, items)
	if err == nil && len(ids) != len(items) {
		err = fmt.Errorf("delivery: the queue recorded %d attempts but returned %d ids", len(items), len(ids))
	}
	return ids, err
}

// done counts and logs h once its record committed as id, or failed with
// err, and lets its worker hand over another attempt.
func (r *batcher) done(h handedOver, id int64, err error) {
	w, row, a, dec := h.w, h.row, h.a, h.dec
	defer func() {
		<-w.unrecorded
		if h.recorded != nil {
			close(h.recorded)
		}
	}()
	if err != nil {
		w.m.unrecorded.Inc()
		w.logger.Error("record attempt", "delivery", row.ID, "event_id", row.EventID, "err", err)
		return
	}
	a.ID = id
	w.m.attempt(dec.Status).Inc()
	w.m.request.Observe(a.Duration.Seconds())
	r.logOutcome(w, row, a, dec)
	switch dec.Status {
	case StatusDelivered:
		w.m.latency.Observe(h.now.Sub(row.CreatedAt).Seconds())
	case StatusDeadLetter:
		w.m.deadLetters.Inc()
	default:
		if !dec.NextAttemptAt.After(r.d.now()) {
			// Due already: a claim made while this record was
			// committing passed the row over.
			w.poke()
		}
	}
}

// logOutcome logs the recorded attempt a of row. A failing target would
// otherwise write a line per attempt (thousands a minute): its first
// failure after a delivery (or since the start) is a warning, the failures
// after it are debug lines until it delivers again, which is logged; dead
// letters are warnings each. Every attempt is in the delivery log and the
// metrics whatever is logged.
func (r *batcher) logOutcome(w *worker, row Row, a Attempt, dec Decision) {
	name := w.t.Name
	r.failingMu.Lock()
	failed, wasFailing := r.failing[name]
	if dec.Status == StatusDelivered {
		delete(r.failing, name)
	} else {
		r.failing[name] = failed + 1
	}
	r.failingMu.Unlock()
	switch dec.Status {
	case StatusDelivered:
		if wasFailing {
			w.logger.Info("target delivers again", "failed_attempts", failed,
				"delivery", row.ID, "event_id", row.EventID)
		}
		if w.logger.Enabled(r.ctx, slog.LevelDebug) {
			attemptLog(w.logger, row, a, dec).Debug("delivered")
		}
		return
	}
	if !wasFailing {
		reason := dec.Reason
		if a.Error != "" {
			reason += " (" + a.Error + ")"
		}
		w.logger.Warn("target failing; further failures at debug until it delivers again",
			"reason", reason, "delivery", row.ID, "event_id", row.EventID, "status", a.StatusCode)
	}
	if dec.Status == StatusDeadLetter {
		attemptLog(w.logger, row, a, dec).Warn("dead-lettered", withErr([]any{"reason", dec.Reason}, a.Error)...)
		return
	}
	if w.logger.Enabled(r.ctx, slog.LevelDebug) {
		attemptLog(w.logger, row, a, dec).Debug("will retry", withErr([]any{"reason", dec.Reason, "next_attempt_at", dec.NextAttemptAt}, a.Error)...)
	}
}

// withErr adds err to a log line's attributes when there is one.
func withErr(attrs []any, err string) []any {
	if err != "" {
		attrs = append(attrs, "err", err)
	}
	return attrs
}
