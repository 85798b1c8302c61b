package sync

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/backstop-sync/backstop"
)

// DefaultLookback is how far before the last successful reconcile's start a
// reconcile looks again when its options give no Lookback.
const DefaultLookback = 10 * time.Minute

// FirstReconcileWindow is how far back the first reconcile of a resource
// looks when its options give neither Since nor Full.
const FirstReconcileWindow = 24 * time.Hour

// ReconcileStore is what Reconcile needs from the store: the mirror's
// versions, the emit path and the bookkeeping of runs. The store adapter
// implements it; see store.DB.
type ReconcileStore interface {
	backstop.EventLog
	// Versions returns the mirrored updated_at of those of ids that are in
	// r's mirror, keyed by id.
	Versions(ctx context.Context, r backstop.Resource, ids []string) (map[string]time.Time, error)
	// StartReconcile records the start of a run and returns its id.
	StartReconcile(ctx context.Context, rep backstop.ReconcileReport) (int64, error)
	// ReconcileProgress records that run runID is still going, so that
	// it is not taken for a run whose process died, and rep's counts so
	// far, so that a run whose process died shows what it did.
	ReconcileProgress(ctx context.Context, runID int64, rep backstop.ReconcileReport) error
	// MarkSeen records ids as seen upstream by run runID.
	MarkSeen(ctx context.Context, runID int64, ids []string) error
	// CountOrphans counts r's mirror objects run runID has not marked seen
	// and forgets the marks.
	CountOrphans(ctx context.Context, runID int64, r backstop.Resource) (int, error)
	// FinishReconcile stores the run's report, also of a failed run.
	FinishReconcile(ctx context.Context, runID int64, rep backstop.ReconcileReport) error
	// LastReconcile returns the start of the last successful non-dry run
	// whose window joined the earlier runs' (see store.DB.LastReconcile):
	// the default window starts from it.
	LastReconcile(ctx context.Context, r backstop.Resource) (startedAt time.Time, ok bool, err error)
}

// ReconcileOptions tune one Reconcile.
type ReconcileOptions struct {
	// Since, when not zero, is the start of the window compared.
	Since time.Time
	// Full compares the whole feed and counts orphans (mirror objects the
	// platform no longer returns). It excludes Since.
	Full bool
	// DryRun compares and counts but emits nothing.
	DryRun bool
	// Lookback is subtracted from the start of the last successful
	// reconcile to make the default window; zero means DefaultLookback.
	Lookback time.Duration
	// Routes are the delivery targets emitted events are queued to.
	Routes []backstop.Route
	// OnPage, when set, is called after each page with the totals so far.
	// It must not block for long.
	OnPage func(ReconcileReport)
}

// ReconcileReport is what one Reconcile found and did.
type ReconcileReport = backstop.ReconcileReport

// Reconcile compares r's objects updated in a window with the mirror and
// emits, through the store's emit path, the event for the current state of
// each object that is missing locally (EventTypeFor with missing) or whose
// mirrored version is older (EventTypeFor without); an object whose
// mirrored version is the same or newer is left alone. Events carry
// EventID(dedup key) and OriginReconcile, so the emit path's dedup decides
// once between them and webhooks: accepted events count as Reemitted,
// duplicates as Suppressed. Only the current version of an object is
// emitted, not the versions between runs. Through a ChangedEmitter
// (Engine.ReconcileEmitter, or the Mirror when it is one, as store.DB is),
// an event whose object a webhook brought in a newer version after the
// page was compared is not emitted either, and counts as Suppressed.
//
// The window starts at opts.Since when set; with opts.Full at the start of
// the feed; otherwise opts.Lookback before the start of the last successful
// non-dry reconcile of r whose window joined the earlier runs' (a run with
// a narrower Since, which left time unread, does not move it: see
// ReconcileStore.LastReconcile), or FirstReconcileWindow before Now on a
// first run.
// The feed is read one page at a time and nothing of a page is kept after
// it, so memory does not grow with the number of objects; with Full the
// ids seen are marked in the store and orphans counted there at the end.
// Reconcile never moves a cursor. The run beats its heartbeat after every
// page, with its counts so far, so that a run whose process was killed
// (its row left running) is told from a live one and closed as abandoned
// by the store, showing what it did.
//
// The engine's Mirror must also be a ReconcileStore (store.DB is); the
// emit path and the run bookkeeping go through it. Every run is stored
// through FinishReconcile, also a failed one. The error
// is ctx.Err() when cancelled, or the source's or store's error naming the
// resource; the report is complete either way.
//
// A run stopped because another resource's request was refused for the
// API key (ctx cancelled with that refusal as its cause) fails saying so
// (StoppedByRefusedKey), and is stored as failed, not interrupted.
func (e *Engine) Reconcile(ctx context.Context, r backstop.Resource, opts ReconcileOptions) (ReconcileReport, error) {
	rep := ReconcileReport{Resource: r, StartedAt: e.now(), Full: opts.Full, DryRun: opts.DryRun}
	if e.OnReconcileDone != nil {
		defer func() { e.OnReconcileDone(rep) }()
	}
	st, ok := e.Mirror.(ReconcileStore)
	if !ok {
		rep.Err = fmt.Errorf("reconcile %s: the mirror %T keeps no events", r, e.Mirror)
		return rep, rep.Err
	}
	if opts.Full && !opts.Since.IsZero() {
		rep.Err = fmt.Errorf("reconcile %s: full and since exclude each other", r)
		return rep, rep.Err
	}
	since, err := reconcileWindow(ctx, st, r, opts, rep.StartedAt)
	if err != nil {
		rep.Err = fmt.Errorf("reconcile %s: %w", r, StoppedByRefusedKey(ctx, err))
		return rep, rep.Err
	}
	rep.Since = since
	runID, err := st.StartReconcile(ctx, rep)
	if err != nil {
		rep.Err = fmt.Errorf("reconcile %s: %w", r, StoppedByRefusedKey(ctx, err))
		return rep, rep.Err
	}
	err = StoppedByRefusedKey(ctx, e.reconcile(ctx, st, runID, &rep, opts))
	rep.Duration = e.now().Sub(rep.StartedAt)
	rep.Err = err
	// The report of a cancelled run is stored too.
	if ferr := st.FinishReconcile(context.WithoutCancel(ctx), runID, rep); ferr != nil {
		ferr = fmt.Errorf("reconcile %s: store report: %w", r, ferr)
		if err == nil {
			rep.Err = ferr
		}
		return rep, errors.Join(err, ferr)
	}
	return rep, err
}

// reconcileWindow returns the start of the window of a run starting at now;
// zero means the start of the feed.
func reconcileWindow(ctx context.Context, st ReconcileStore, r backstop.Resource, opts ReconcileOptions, now time.Time) (time.Time, error) {
	switch {
	case !opts.Since.IsZero():
		return opts.Since, nil
	case opts.Full:
		return time.Time{}, nil
	}
	last, ok, err := st.LastReconcile(ctx, r)
	if err != nil {
		return time.Time{}, err
	}
	if !ok {
		return now.Add(-FirstReconcileWindow), nil
	}
	lookback := opts.Lookback
	if lookback <= 0 {
		lookback = DefaultLookback
	}
	return last.Add(-lookback), nil
}

// reconcile pages through the window, filling rep.
func (e *Engine) reconcile(ctx context.Context, st ReconcileStore, runID int64, rep *ReconcileReport, opts ReconcileOptions) error {
	r := rep.Resource
	log := e.logger().With("resource", r, "op", "reconcile", "run", runID)
	var cursor string
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		page, err := e.Source.List(ctx, backstop.ListRequest{Resource: r, Cursor: cursor, Limit: e.PageSize, Since: rep.Since})
		rep.Cost = rep.Cost.Add(page.Cost)
		if err != nil {
			var apiErr *backstop.APIError
			switch {
			case ctx.Err() != nil && errors.Is(err, ctx.Err()):
				return ctx.Err()
			case errors.As(err, &apiErr):
				return fmt.Errorf("reconcile: %w", err) // it names the resource
			}
			return fmt.Errorf("reconcile %s: %w", r, err)
		}
		if page.HasMore && (page.NextCursor == "" || page.NextCursor == cursor) {
			return fmt.Errorf("reconcile %s: the platform answered has_more without moving the cursor %q", r, cursor)
		}
		rep.Pages++
		// A page read is compared and emitted even when ctx was cancelled
		// meanwhile, as sync commits it.
		if err := e.reconcilePage(context.WithoutCancel(ctx), st, runID, rep, opts, page.Objects); err != nil {
			return fmt.Errorf("reconcile %s: page %d: %w", r, rep.Pages, err)
		}
		beat := *rep
		beat.Duration = e.now().Sub(rep.StartedAt)
		if err := st.ReconcileProgress(context.WithoutCancel(ctx), runID, beat); err != nil {
			return fmt.Errorf("reconcile %s: page %d: %w", r, rep.Pages, err)
		}
		log.Debug("page reconciled", "page", rep.Pages, "objects", len(page.Objects),
			"missing", rep.Missing, "behind", rep.Behind, "has_more", page.HasMore)
		if opts.OnPage != nil || e.OnReconcilePage != nil {
			snap := *rep
			snap.Duration = e.now().Sub(rep.StartedAt)
			if opts.OnPage != nil {
				opts.OnPage(snap)
			}
			if e.OnReconcilePage != nil {
				e.OnReconcilePage(snap)
			}
		}
		if !page.HasMore {
			break
		}
		cursor = page.NextCursor
	}
	if rep.Full {
		n, err := st.CountOrphans(ctx, runID, r)
		if err != nil {
			return fmt.Errorf("reconcile %s: %w", r, err)
		}
		rep.Orphans = n
	}
	return nil
}

// reconcilePage compares one page with the mirror and emits its events in
// one batch.
func (e *Engine) reconcilePage(ctx context.Context, st ReconcileStore, runID int64, rep *ReconcileReport, opts ReconcileOptions, objs []backstop.Object) error {
	rep.Scanned += len(objs)
	if len(objs) == 0 {
		return nil
	}
	ids := make([]string, len(objs))
	for i, o := range objs {
		ids[i] = o.ID
	}
	if rep.Full {
		if err := st.MarkSeen(ctx, runID, ids); err != nil {
			return err
		}
	}
	stored, err := st.Versions(ctx, rep.Resource, ids)
	if err != nil {
		return err
	}
	now := e.now()
	var events []backstop.Event
	for _, o := range objs {
		v, ok := stored[o.ID]
		switch {
		case !ok:
			rep.Missing++
		case v.Before(o.UpdatedAt):
			rep.Behind++
		default:
			continue
		}
		typ := backstop.EventTypeFor(rep.Resource, o.Data, !ok)
		if typ == "" {
			return fmt.Errorf("%s: no event type for its state", o.ID)
		}
		if opts.DryRun {
			continue
		}
		events = append(events, backstop.Event{
			ID:        backstop.EventID(backstop.DedupKey(rep.Resource, o.ID, o.UpdatedAt)),
			Type:      typ,
			Resource:  rep.Resource,
			ObjectID:  o.ID,
			UpdatedAt: o.UpdatedAt,
			CreatedAt: now,
			Origin:    backstop.OriginReconcile,
			Data:      o.Data,
		})
	}
	if len(events) == 0 {
		return nil
	}
	var res []backstop.EmitResult
	if em := e.reconcileEmitter(); em != nil {
		res, err = em.EmitChanged(ctx, events, opts.Routes)
	} else {
		res, err = st.Emit(ctx, events, opts.Routes)
	}
	if err != nil {
		return err
	}
	for _, x := range res {
		// Not accepted: a duplicate of a version already processed, or
		// superseded by a newer one that came meanwhile (ChangedEmitter).
		if x.Status == backstop.EmitAccepted {
			rep.Reemitted++
		} else {
			rep.Suppressed++
		}
	}
	return nil
}

// ErrStoppedByKey marks the error of a run StoppedByRefusedKey stopped.
var ErrStoppedByKey = errors.New("stopped before it finished, as another resource's request was refused")

// StoppedByRefusedKey returns err, or, for the cancellation of a run whose
// context was cancelled with a refusal of the API key (ErrUnauthorized) as
// its cause (another resource's request was refused, and the key is
// shared), an error that says so: ErrStoppedByKey and ErrUnauthorized, not
// a cancellation, as the run was not interrupted and is not to be resumed
// as it is.
func StoppedByRefusedKey(ctx context.Context, err error) error {
	if err == nil || !errors.Is(err, context.Canceled) {
		return err
	}
	if cause := context.Cause(ctx); errors.Is(cause, backstop.ErrUnauthorized) && !errors.Is(cause, context.Canceled) {
		return fmt.Errorf("%w: %w", ErrStoppedByKey, backstop.ErrUnauthorized)
	}
	return err
}
