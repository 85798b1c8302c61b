// Package sync is the engine: it pages through the platform's change feeds
// into the mirror (sync and backfill, optionally emitting their changes),
// reconciles the mirror with the platform and re-emits what was missed, and
// runs configured jobs on their schedules (Scheduler, under gocron).
//
// It talks to its adapters only through the root interfaces
// (backstop.Source, backstop.Mirror). The name shadows the standard
// library's sync; files that need both alias one of them.
package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/backstop-sync/backstop"
)

// Engine runs sync and backfill over one source and one mirror. The zero
// value is not usable; set Source and Mirror. An Engine is safe for
// concurrent runs over different resources.
type Engine struct {
	Source backstop.Source
	Mirror backstop.Mirror
	// PageSize is sent as cursor_limit; zero leaves it to the source.
	PageSize int
	Logger   *slog.Logger
	// OnPage, when set, is called after each committed page with the run's
	// totals so far (for progress display). It must not block for long.
	OnPage func(backstop.RunStats)
	// OnDone, when set, is called when a Sync, SyncEmit, Backfill or
	// BackfillEmit of one resource ends, with its final stats (Err set
	// when it did not finish). It must not block for long.
	OnDone func(backstop.RunStats)
	// OnReconcilePage and OnReconcileDone are OnPage and OnDone for
	// Reconcile (OnReconcilePage is called beside ReconcileOptions.OnPage).
	OnReconcilePage func(ReconcileReport)
	OnReconcileDone func(ReconcileReport)
	// EmitGuard, when set, commits the pages of SyncEmit and BackfillEmit
	// instead of the Mirror's EmitPage, refusing a page whose cursor was
	// reset since the run read it (see CursorGuard); usually the store
	// itself. It is not taken from the Mirror, since a Mirror that wraps
	// the store to act on each EmitPage (serve's, which wakes the
	// targets) would be bypassed: such a wrapper sets it to itself once it
	// wraps EmitPageAt too. Unset, emitting runs save their cursor as
	// before, and a reset made while one runs can be undone by it.
	EmitGuard GuardedPageStore
	// ReconcileEmitter emits Reconcile's events, leaving out, inside the
	// emit's transaction, an event whose object a webhook brought in a
	// newer version after Reconcile compared it (see ChangedEmitter).
	// Unset, the Mirror is used when it is a ChangedEmitter (store.DB
	// is, and so is serve's wrapper, which wakes the targets); a Mirror
	// that is not emits through its Emit, and such an event then queues
	// the older state after the newer one.
	ReconcileEmitter ChangedEmitter
	// Command is how the commands that its errors and logs suggest begin
	// ("backstop --config prod.yaml"); "backstop" when empty.
	Command string
	// Routes are the delivery targets' subscriptions, for the command a
	// finished backfill suggests to read everything again: with --emit
	// where a restart without it would be refused (CheckBackfill). Nil
	// suggests it without.
	Routes []backstop.Route
	// Now defaults to time.Now.
	Now func() time.Time
}

// restartEmit is " --emit" when a restart of r's finished backfill must
// emit: this run does (emitting), or one without emitting would be refused
// (CheckBackfill with routes); else "".
func (e *Engine) restartEmit(ctx context.Context, r backstop.Resource, emitting bool, routes []backstop.Route) string {
	if emitting || errors.Is(e.CheckBackfill(ctx, r, true, routes), ErrSilentBackfill) {
		return " --emit"
	}
	return ""
}

// command is Command, or "backstop".
func (e *Engine) command() string {
	if e.Command == "" {
		return "backstop"
	}
	return e.Command
}

// reconcileEmitter is ReconcileEmitter, or the Mirror when it is a
// ChangedEmitter, or nil.
func (e *Engine) reconcileEmitter() ChangedEmitter {
	if e.ReconcileEmitter != nil {
		return e.ReconcileEmitter
	}
	em, _ := e.Mirror.(ChangedEmitter)
	return em
}

func (e *Engine) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

// done reports a finished feed run to OnDone and returns its results.
func (e *Engine) done(st backstop.RunStats, err error) (backstop.RunStats, error) {
	if e.OnDone != nil {
		snap := st
		snap.Err = err
		e.OnDone(snap)
	}
	return st, err
}

func (e *Engine) logger() *slog.Logger {
	if e.Logger != nil {
		return e.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// Sync reads r's change feed from its saved incremental cursor (the start of
// the feed when none is saved) to the end, committing each page and the
// cursor after it in one transaction. The saved cursor never moves back:
// when another run of r (an overlapping sync) has saved a later position,
// this one's pages are still committed but leave the cursor there.
//
// Cancelling ctx stops the run between pages: a page already fetched is
// committed with its cursor, a fetch in flight is abandoned (the cursor has
// not moved past it). The returned stats are complete either way; the error
// is ctx.Err() when cancelled, or the source's or mirror's error, which names
// the resource.
//
// When r's cursors are reset (backstop cursors reset) while it runs, and
// the Mirror is a CursorGuard (store.DB is), its next page is not committed
// and it stops with an error that wraps ErrCursorReset: the reset stands,
// and the next run starts from it.
func (e *Engine) Sync(ctx context.Context, r backstop.Resource) (backstop.RunStats, error) {
	cur, _, gen, err := e.syncCursor(ctx, r)
	if err != nil {
		return e.done(backstop.RunStats{Resource: r}, err)
	}
	st, _, err := e.pages(ctx, cur, gen, "sync", nil)
	return e.done(st, err)
}

// ErrCursorReset is wrapped by the error of a sync or backfill whose
// cursor was reset (backstop cursors reset, or a backfill --restart) while
// it ran: it stopped without committing its page, so the reset stands.
var ErrCursorReset = errors.New("its cursor was reset while it ran")

// CursorGuard is a Mirror that counts the resets of each cursor (its
// generation), so that a run that read a cursor before a reset cannot save
// its position over it. store.DB is one. With a Mirror that is not, runs
// page as before and a reset made while one runs can be undone by it.
type CursorGuard interface {
	// CursorGeneration is Cursor that also returns the cursor's reset
	// generation, read together with it.
	CursorGeneration(ctx context.Context, r backstop.Resource, kind backstop.CursorKind) (backstop.Cursor, bool, int64, error)
	// ApplyPageAt is ApplyPage that commits nothing and reports
	// reset=true when the cursor's generation is no longer gen.
	ApplyPageAt(ctx context.Context, gen int64, objs []backstop.Object, cur backstop.Cursor) (backstop.ApplyResult, bool, error)
}

// unguarded is the generation of a run over a Mirror that is not a
// CursorGuard.
const unguarded int64 = -1

// cursor reads r's cursor of kind and its reset generation (unguarded when
// the Mirror does not count resets). With none saved it returns the start
// of the feed.
func (e *Engine) cursor(ctx context.Context, r backstop.Resource, kind backstop.CursorKind) (backstop.Cursor, bool, int64, error) {
	var (
		cur backstop.Cursor
		ok  bool
		gen = unguarded
		err error
	)
	if g, guarded := e.Mirror.(CursorGuard); guarded {
		cur, ok, gen, err = g.CursorGeneration(ctx, r, kind)
	} else {
		cur, ok, err = e.Mirror.Cursor(ctx, r, kind)
	}
	if err != nil {
		return backstop.Cursor{}, false, unguarded, err
	}
	if !ok {
		cur = backstop.Cursor{Resource: r, Kind: kind}
	}
	return cur, ok, gen, nil
}

// syncCursor is r's sync cursor and generation for Sync and SyncEmit, and
// whether one was saved (else cur is the start of the feed).
func (e *Engine) syncCursor(ctx context.Context, r backstop.Resource) (cur backstop.Cursor, saved bool, gen int64, err error) {
	cur, saved, gen, err = e.cursor(ctx, r, backstop.CursorSync)
	if err != nil {
		return cur, false, gen, fmt.Errorf("sync %s: %w", r, err)
	}
	return cur, saved, gen, nil
}

// Backfill reads r's whole change feed from the start into the mirror,
// moving only its own checkpoint (never the incremental cursor), so a
// backfill killed at any point resumes from its last committed page. A
// finished backfill is not run again (an interrupted run over several
// resources resumes only the unfinished ones); restart deletes the
// checkpoint and starts from the beginning whatever it said (the Mirror
// must then be a CursorResetter, as store.DB is). Page commits never move
// either cursor back, also when two runs of one resource overlap.
//
// The checkpoint carries when the backfill that began it started
// (Cursor.StartedAt): a run that resumes it keeps that time, a restart
// saves its own.
//
// At the end it hands its position to the incremental cursor when that is
// behind (or unset), so a following sync continues from there rather than
// reading everything again. Cancellation behaves as in Sync.
func (e *Engine) Backfill(ctx context.Context, r backstop.Resource, restart bool) (backstop.RunStats, error) {
	return e.done(e.backfill(ctx, r, restart, nil))
}

func (e *Engine) backfill(ctx context.Context, r backstop.Resource, restart bool, em *pageEmitter) (backstop.RunStats, error) {
	start := e.now()
	cur, ok, gen, err := e.cursor(ctx, r, backstop.CursorBackfill)
	if err != nil {
		return backstop.RunStats{Resource: r}, fmt.Errorf("backfill %s: %w", r, err)
	}
	switch {
	case ok && cur.Done && !restart:
		e.logger().Info("backfill already finished; `"+e.command()+" backfill "+string(r)+" --restart"+e.restartEmit(ctx, r, em != nil && em.quiet == nil, e.Routes)+"` reads everything again", "resource", r,
			"finished_at", cur.UpdatedAt, "position", cur.Position)
		// A run killed between its last page and the hand-off left the
		// sync cursor behind: hand it over now, as that run would have.
		if err := e.handOff(ctx, cur); err != nil {
			return backstop.RunStats{Resource: r, Err: err}, err
		}
		return backstop.RunStats{Resource: r, AlreadyDone: true}, nil
	case !ok || restart:
		if ok {
			// Page commits never move a saved cursor back, so the old
			// checkpoint is deleted for the new one to start over.
			if err := e.resetCursor(ctx, r, backstop.CursorBackfill); err != nil {
				return backstop.RunStats{Resource: r, Err: err}, err
			}
			if !cur.Done {
				e.logger().Info("discarding unfinished backfill checkpoint", "resource", r, "position", cur.Position)
			}
			// The reset counted one more generation: this run starts
			// from it.
			if cur, _, gen, err = e.cursor(ctx, r, backstop.CursorBackfill); err != nil {
				err = fmt.Errorf("backfill %s: %w", r, err)
				return backstop.RunStats{Resource: r, Err: err}, err
			}
		}
		cur = backstop.Cursor{Resource: r, Kind: backstop.CursorBackfill, StartedAt: start}
		// The checkpoint is begun now, at the start of the feed, with
		// its start: saved only with the first page, a backfill stopped
		// before that page (queued behind the other resources, or its
		// first request unanswered) had none, and its resume took its
		// own start, so that what changed while it was stopped was
		// written without events.
		if _, err := e.Mirror.AdvanceCursor(ctx, cur); err != nil {
			err = fmt.Errorf("backfill %s: begin checkpoint: %w", r, err)
			return backstop.RunStats{Resource: r, Err: err}, err
		}
	case cur.Value != "":
		log := e.logger().With("resource", r, "position", cur.Position)
		if !cur.StartedAt.IsZero() {
			log = log.With("started_at", cur.StartedAt)
		}
		log.Info("resuming backfill")
	}
	if cur.StartedAt.IsZero() {
		// A checkpoint saved by a backstop that did not record when its
		// backfill started: this run's start is the best known, as it
		// was before (a backfill without events then writes silently a
		// change made on the platform while it was stopped). Saved with
		// the next page, it is the start a later resume keeps.
		if em != nil && em.quiet != nil {
			e.logger().Warn("resuming a backfill checkpoint that does not say when its backfill started (saved by an older backstop): changes made while it was stopped are written without events when older than this run's start; this run's start is kept from now on",
				"resource", r, "position", cur.Position)
		}
		cur.StartedAt = start
	}
	st, last, err := e.pages(ctx, cur, gen, "backfill", em)
	if err != nil {
		return st, err
	}
	return st, e.handOff(ctx, last)
}

// handOff saves the position of last, a finished backfill's checkpoint, as
// the sync cursor of its resource when that is behind or unset, so the
// next sync continues from there.
func (e *Engine) handOff(ctx context.Context, last backstop.Cursor) error {
	handoff := last
	handoff.Kind = backstop.CursorSync
	handoff.Done = false
	handoff.StartedAt = time.Time{} // a backfill checkpoint's alone
	// The hand-off is a bookkeeping step of a finished run: it is not
	// abandoned because the user pressed Ctrl-C just now.
	moved, err := e.Mirror.AdvanceCursor(context.WithoutCancel(ctx), handoff)
	if err != nil {
		return fmt.Errorf("backfill %s: hand position to sync cursor: %w", last.Resource, err)
	}
	if moved {
		e.logger().Info("sync cursor moved to the end of the backfill", "resource", last.Resource, "position", last.Position)
	}
	return nil
}

// CursorResetter is a Mirror that can delete one saved cursor of a
// resource (store.DB is one). Page commits never move a saved cursor back,
// so Backfill with restart deletes its old checkpoint through it to start
// over.
type CursorResetter interface {
	// ResetCursor deletes the saved cursor of r and kind, if any.
	ResetCursor(ctx context.Context, r backstop.Resource, kind backstop.CursorKind) error
}

// resetCursor deletes r's cursor of kind through the Mirror's
// CursorResetter, and fails when the Mirror is not one.
func (e *Engine) resetCursor(ctx context.Context, r backstop.Resource, kind backstop.CursorKind) error {
	cr, ok := e.Mirror.(CursorResetter)
	if !ok {
		return fmt.Errorf("backfill %s: restart: the mirror %T cannot reset its %s cursor", r, e.Mirror, kind)
	}
	if err := cr.ResetCursor(ctx, r, kind); err != nil {
		return fmt.Errorf("backfill %s: restart: %w", r, err)
	}
	return nil
}

// pages walks the feed from cur until has_more is false, saving cur's kind.
// Each page is committed with ApplyPage, or through the emit path when em
// is not nil; with a generation other than unguarded, only while cur's
// cursor has not been reset since it was read at gen (ErrCursorReset
// otherwise). It returns the last cursor saved.
func (e *Engine) pages(ctx context.Context, cur backstop.Cursor, gen int64, op string, em *pageEmitter) (st backstop.RunStats, _ backstop.Cursor, _ error) {
	r := cur.Resource
	log := e.logger().With("resource", r, "op", op)
	st = backstop.RunStats{Resource: r}
	start := e.now()
	defer func() { st.Duration = e.now().Sub(start) }()

	for {
		if err := ctx.Err(); err != nil {
			st.Err = err
			return st, cur, err
		}
		page, err := e.Source.List(ctx, backstop.ListRequest{Resource: r, Cursor: cur.Value, Limit: e.PageSize})
		st.Cost = st.Cost.Add(page.Cost)
		if err != nil {
			var apiErr *backstop.APIError
			switch {
			case ctx.Err() != nil && errors.Is(err, ctx.Err()):
				err = ctx.Err()
			case errors.As(err, &apiErr):
				err = fmt.Errorf("%s: %w", op, err) // it names the resource
			default:
				err = fmt.Errorf("%s %s: %w", op, r, err)
			}
			st.Err = err
			return st, cur, err
		}
		if page.HasMore && (page.NextCursor == "" || page.NextCursor == cur.Value) {
			// Following it would ask for the same page again, forever.
			err := fmt.Errorf("%s %s: the platform answered has_more without moving the cursor %q", op, r, cur.Value)
			st.Err = err
			return st, cur, err
		}
		next := cur
		next.Value = page.NextCursor
		if next.Value == "" {
			next.Value = cur.Value
		}
		if n := len(page.Objects); n > 0 {
			last := page.Objects[n-1].Position()
			if last.Compare(next.Position) > 0 {
				next.Position = last
			}
		}
		next.Done = cur.Kind == backstop.CursorBackfill && !page.HasMore
		// A fetched page is always committed, even when ctx was cancelled
		// meanwhile: finishing it is what makes Ctrl-C safe and cheap.
		var (
			res   backstop.ApplyResult
			reset bool
		)
		switch {
		case em != nil:
			res, reset, err = em.commit(context.WithoutCancel(ctx), gen, r, page.Objects, next)
		case gen != unguarded:
			res, reset, err = e.Mirror.(CursorGuard).ApplyPageAt(context.WithoutCancel(ctx), gen, page.Objects, next)
		default:
			res, err = e.Mirror.ApplyPage(context.WithoutCancel(ctx), page.Objects, next)
		}
		if err == nil && reset {
			err = e.resetWhileRunning(cur, op)
			st.Err = err
			return st, cur, err
		}
		if err != nil {
			err = fmt.Errorf("%s %s: commit page: %w", op, r, err)
			st.Err = err
			return st, cur, err
		}
		cur = next
		page.Cost = backstop.Cost{} // already added above
		st.AddPage(page, res)
		log.Debug("page committed", "page", st.Pages, "objects", len(page.Objects),
			"new", res.New, "updated", res.Updated, "has_more", page.HasMore)
		if e.OnPage != nil {
			snap := st
			snap.Duration = e.now().Sub(start)
			e.OnPage(snap)
		}
		if !page.HasMore {
			return st, cur, nil
		}
	}
}

// resetWhileRunning logs and returns the error of a run whose cursor cur
// was reset since it read it: the page it fetched was not committed.
func (e *Engine) resetWhileRunning(cur backstop.Cursor, op string) error {
	how := "`backstop cursors reset " + string(cur.Resource) + "`"
	if cur.Kind == backstop.CursorBackfill {
		how += " or `backstop backfill " + string(cur.Resource) + " --restart`"
	}
	e.logger().Warn("cursor reset while the run was reading; stopped without saving over the reset",
		"resource", cur.Resource, "op", op, "kind", cur.Kind, "position", cur.Position)
	return fmt.Errorf("%s %s: %w (by %s): stopped without committing its page or moving the %s cursor; the next %s starts from the reset cursor",
		op, cur.Resource, ErrCursorReset, how, cur.Kind, op)
}

// PageStore is what SyncEmit and BackfillEmit need from the store: the
// mirror's versions and an emit path that commits a page's events together
// with its cursor. The store adapter implements it; see store.DB.
type PageStore interface {
	// Versions returns the mirrored updated_at of those of ids that are in
	// r's mirror, keyed by id.
	Versions(ctx context.Context, r backstop.Resource, ids []string) (map[string]time.Time, error)
	// EmitPage emits events through the emit path and saves cur in one
	// transaction: the cursor is never ahead of the events.
	EmitPage(ctx context.Context, events []backstop.Event, routes []backstop.Route, cur backstop.Cursor) ([]backstop.EmitResult, error)
}

// EmitStats counts what a run that emits its changes emitted.
type EmitStats struct {
	// Emitted counts events the emit path accepted, Suppressed those it
	// did not: duplicates (a webhook or an earlier run had them), or
	// versions a webhook superseded while the page was in flight.
	Emitted, Suppressed int
}

// SyncEmit is Sync that also emits, through the store's emit path with
// OriginSync, the event for the current state of every object of the feed
// that is new to the mirror or newer than its mirrored version
// (backstop.EventTypeFor), queued to the matching routes. Each page's events
// and the cursor after it commit in one transaction, so a page is either
// emitted and passed, or neither; events carry EventID(dedup key), so an
// object a webhook already delivered is suppressed as a duplicate.
// Unchanged objects emit nothing. The engine's Mirror must be a PageStore
// (store.DB is). Errors and cancellation behave as in Sync. From no sync
// cursor, while r's first fill (a backfill that does not emit) is
// unfinished and a route subscribes to r's events, it reads nothing and
// returns an error wrapping ErrFirstFillUnfinished.
func (e *Engine) SyncEmit(ctx context.Context, r backstop.Resource, routes []backstop.Route) (backstop.RunStats, EmitStats, error) {
	em, err := e.emitter(r, routes, backstop.OriginSync)
	if err != nil {
		st, err := e.done(backstop.RunStats{Resource: r, Err: err}, err)
		return st, EmitStats{}, err
	}
	cur, saved, gen, err := e.syncCursor(ctx, r)
	if err == nil && !saved {
		// From the start of the feed: not while a silent first fill is
		// unfinished.
		if err = e.checkFirstFill(ctx, r, routes); err != nil {
			err = fmt.Errorf("sync %s: %w", r, err)
		}
	}
	if err != nil {
		st, err := e.done(backstop.RunStats{Resource: r, Err: err}, err)
		return st, EmitStats{}, err
	}
	st, _, err := e.pages(ctx, cur, gen, "sync", em)
	st, err = e.done(st, err)
	return st, em.stats, err
}

// BackfillEmit is Backfill that emits as SyncEmit does, with
// OriginBackfill. Its checkpoint, resumption and hand-off to the sync
// cursor are Backfill's.
func (e *Engine) BackfillEmit(ctx context.Context, r backstop.Resource, restart bool, routes []backstop.Route) (backstop.RunStats, EmitStats, error) {
	em, err := e.emitter(r, routes, backstop.OriginBackfill)
	if err != nil {
		st, err := e.done(backstop.RunStats{Resource: r, Err: err}, err)
		return st, EmitStats{}, err
	}
	st, err := e.done(e.backfill(ctx, r, restart, em))
	return st, em.stats, err
}

// QuietMargin is how far before its start (that of the backfill that began
// its checkpoint, or before the oldest event of the resource backstop
// keeps) a backfill that does not emit still emits the versions it writes
// (see BackfillQuiet): enough for the platform's clock being a little off
// ours and for webhooks still in flight.
const QuietMargin = 10 * time.Minute

// QuietPageStore is a PageStore that can commit a page partly without
// events (store.DB is one): what BackfillQuiet needs.
type QuietPageStore interface {
	PageStore
	// ApplyEmitPageAt writes silent's objects to the mirror without events
	// (each only when newer) and emits events, saving cur, in one
	// transaction; with gen other than unguarded, only while cur's cursor
	// has not been reset since it was read at gen (reset=true otherwise,
	// nothing committed). The ApplyResult counts silent's objects.
	ApplyEmitPageAt(ctx context.Context, gen int64, silent []backstop.Object, events []backstop.Event, routes []backstop.Route, cur backstop.Cursor) (backstop.ApplyResult, []backstop.EmitResult, bool, error)
	// OldestEventAt returns when the oldest processed event of r kept was
	// received; ok is false when none is kept.
	OldestEventAt(ctx context.Context, r backstop.Resource) (at time.Time, ok bool, err error)
}

// BackfillQuiet is the backfill that does not emit its history: Backfill
// that writes without an event only the versions from before the backfill
// started, and before the oldest event of r that backstop keeps, less
// QuietMargin; a newer version (a change made while it runs, or while it
// was stopped before this run resumed it, or one whose webhook was lost
// while backstop was already recording r's events) is emitted as SyncEmit
// would (OriginSync, through the dedup, so a version a
// webhook already brought is suppressed). Written silently, such a
// version would look unchanged to reconcile, and its event would never
// reach the targets. Its checkpoint, resumption and hand-off are
// Backfill's; the EmitStats count the versions it emitted. The engine's
// Mirror must be a QuietPageStore.
func (e *Engine) BackfillQuiet(ctx context.Context, r backstop.Resource, restart bool, routes []backstop.Route) (backstop.RunStats, EmitStats, error) {
	em, err := e.emitter(r, routes, backstop.OriginSync)
	if err == nil {
		em.quiet, err = e.quietStore(r)
	}
	if err == nil {
		// Found at the first page: a finished backfill, which reads
		// nothing, does not look for the oldest event.
		em.quietSince = func(ctx context.Context, started time.Time) (time.Time, error) {
			return e.quietSince(ctx, r, em.quiet, started)
		}
	}
	if err != nil {
		st, err := e.done(backstop.RunStats{Resource: r, Err: err}, err)
		return st, EmitStats{}, err
	}
	st, err := e.done(e.backfill(ctx, r, restart, em))
	return st, em.stats, err
}

// quietStore returns the Mirror as a QuietPageStore.
func (e *Engine) quietStore(r backstop.Resource) (QuietPageStore, error) {
	q, ok := e.Mirror.(QuietPageStore)
	if !ok {
		return nil, fmt.Errorf("backfill %s: the mirror %T cannot write a page partly without events", r, e.Mirror)
	}
	return q, nil
}

// quietSince returns the time before which BackfillQuiet writes versions
// of r without events, for a backfill whose checkpoint was begun at
// started (zero when unknown). A resumed run takes the first run's start,
// not its own: a change made while the backfill was stopped is newer than
// what the first run set out to write silently, and its event must go out.
func (e *Engine) quietSince(ctx context.Context, r backstop.Resource, q QuietPageStore, started time.Time) (time.Time, error) {
	since := e.now()
	if !started.IsZero() && started.Before(since) {
		since = started
	}
	oldest, ok, err := q.OldestEventAt(ctx, r)
	if err != nil {
		return time.Time{}, fmt.Errorf("backfill %s: %w", r, err)
	}
	if ok && oldest.Before(since) {
		since = oldest
	}
	since = since.Add(-QuietMargin)
	e.logger().Info("backfill without emitting: versions updated since then are emitted all the same (origin sync), older ones written without events",
		"resource", r, "since", since.UTC().Format(time.RFC3339))
	return since, nil
}

func (e *Engine) emitter(r backstop.Resource, routes []backstop.Route, origin backstop.Origin) (*pageEmitter, error) {
	ps, ok := e.Mirror.(PageStore)
	if !ok {
		return nil, fmt.Errorf("%s %s: the mirror %T keeps no events", origin, r, e.Mirror)
	}
	em := &pageEmitter{store: ps, routes: routes, origin: origin, now: e.now}
	em.guarded = e.EmitGuard
	return em, nil
}

// GuardedPageStore is a PageStore whose page commits can be refused when
// the cursor was reset since a run read it (see CursorGuard); store.DB is
// one.
type GuardedPageStore interface {
	// EmitPageAt is EmitPage that commits nothing and reports reset=true
	// when the cursor's reset generation is no longer gen.
	EmitPageAt(ctx context.Context, gen int64, events []backstop.Event, routes []backstop.Route, cur backstop.Cursor) ([]backstop.EmitResult, bool, error)
}

// ChangedEmitter is an emit path that compares each event with the mirror
// again inside its own transaction (store.DB is one): Reconcile compares a
// page with the mirror before it emits, and a webhook for a newer version
// of an object may commit in between.
type ChangedEmitter interface {
	// EmitChanged is Emit that leaves out, as backstop.EmitSuperseded,
	// each event whose object the mirror holds in a newer version than
	// the event's when its transaction runs: nothing of it is stored or
	// queued.
	EmitChanged(ctx context.Context, events []backstop.Event, routes []backstop.Route) ([]backstop.EmitResult, error)
}

// pageEmitter commits feed pages through the emit path and counts.
type pageEmitter struct {
	store   PageStore
	guarded GuardedPageStore // Engine.EmitGuard
	routes  []backstop.Route
	origin  backstop.Origin
	now     func() time.Time
	stats   EmitStats
	// quiet, when set, commits the pages: the new and newer objects
	// updated before silentBefore are written without events.
	// quietSince finds silentBefore, at the first page, from the start of
	// the backfill that began the checkpoint (Cursor.StartedAt).
	quiet        QuietPageStore
	quietSince   func(ctx context.Context, started time.Time) (time.Time, error)
	silentBefore time.Time
}

// commit emits the events of objs' new and changed objects and saves next,
// in one transaction, unless the cursor was reset since it was read at gen
// (reset=true, nothing committed; see pages). The ApplyResult is counted
// against the mirror as it was before the page.
func (em *pageEmitter) commit(ctx context.Context, gen int64, r backstop.Resource, objs []backstop.Object, next backstop.Cursor) (_ backstop.ApplyResult, reset bool, _ error) {
	var res backstop.ApplyResult
	ids := make([]string, len(objs))
	for i, o := range objs {
		ids[i] = o.ID
	}
	stored, err := em.store.Versions(ctx, r, ids)
	if err != nil {
		return res, false, err
	}
	if em.quiet != nil && em.silentBefore.IsZero() {
		if em.silentBefore, err = em.quietSince(ctx, next.StartedAt); err != nil {
			return res, false, err
		}
	}
	now := em.now()
	events := make([]backstop.Event, 0, len(objs))
	var silent []backstop.Object
	for _, o := range objs {
		v, ok := stored[o.ID]
		if em.quiet != nil && o.UpdatedAt.Before(em.silentBefore) {
			if !ok || v.Before(o.UpdatedAt) {
				// Counted by the store against the mirror in its
				// transaction.
				silent = append(silent, o)
				stored[o.ID] = o.UpdatedAt
			} else {
				res.Unchanged++
			}
			continue
		}
		switch {
		case !ok:
			res.New++
		case v.Before(o.UpdatedAt):
			res.Updated++
		default:
			res.Unchanged++
			continue
		}
		stored[o.ID] = o.UpdatedAt // a later copy in the same page compares with this one
		typ := backstop.EventTypeFor(r, o.Data, !ok)
		if typ == "" {
			return res, false, fmt.Errorf("%s: no event type for its state", o.ID)
		}
		events = append(events, backstop.Event{
			ID:        backstop.EventID(backstop.DedupKey(r, o.ID, o.UpdatedAt)),
			Type:      typ,
			Resource:  r,
			ObjectID:  o.ID,
			UpdatedAt: o.UpdatedAt,
			CreatedAt: now,
			Origin:    em.origin,
			Data:      o.Data,
		})
	}
	var out []backstop.EmitResult
	switch {
	case em.quiet != nil:
		var sres backstop.ApplyResult
		sres, out, reset, err = em.quiet.ApplyEmitPageAt(ctx, gen, silent, events, em.routes, next)
		res.New += sres.New
		res.Updated += sres.Updated
		res.Unchanged += sres.Unchanged
	case em.guarded != nil && gen != unguarded:
		out, reset, err = em.guarded.EmitPageAt(ctx, gen, events, em.routes, next)
	default:
		out, err = em.store.EmitPage(ctx, events, em.routes, next)
	}
	if err != nil || reset {
		return backstop.ApplyResult{}, reset, err
	}
	for _, x := range out {
		switch x.Status {
		case backstop.EmitAccepted:
			em.stats.Emitted++
		case backstop.EmitDuplicate, backstop.EmitSuperseded:
			em.stats.Suppressed++
		}
	}
	return res, false, nil
}
