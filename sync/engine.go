// Package sync is the engine: it pages through the platform's change feeds
// into the mirror (sync and backfill), and later reconciles and emits events.
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
	// Now defaults to time.Now.
	Now func() time.Time
}

func (e *Engine) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

func (e *Engine) logger() *slog.Logger {
	if e.Logger != nil {
		return e.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// Sync reads r's change feed from its saved incremental cursor (the start of
// the feed when none is saved) to the end, committing each page and the
// cursor after it in one transaction.
//
// Cancelling ctx stops the run between pages: a page already fetched is
// committed with its cursor, a fetch in flight is abandoned (the cursor has
// not moved past it). The returned stats are complete either way; the error
// is ctx.Err() when cancelled, or the source's or mirror's error, which names
// the resource.
func (e *Engine) Sync(ctx context.Context, r backstop.Resource) (backstop.RunStats, error) {
	cur, ok, err := e.Mirror.Cursor(ctx, r, backstop.CursorSync)
	if err != nil {
		return backstop.RunStats{Resource: r}, fmt.Errorf("sync %s: %w", r, err)
	}
	if !ok {
		cur = backstop.Cursor{Resource: r, Kind: backstop.CursorSync}
	}
	st, _, err := e.pages(ctx, cur, "sync")
	return st, err
}

// Backfill reads r's whole change feed from the start into the mirror,
// moving only its own checkpoint (never the incremental cursor), so a
// backfill killed at any point resumes from its last committed page. A
// finished backfill is not run again (an interrupted run over several
// resources resumes only the unfinished ones); restart starts from the
// beginning whatever the checkpoint says.
//
// At the end it hands its position to the incremental cursor when that is
// behind (or unset), so a following sync continues from there rather than
// reading everything again. Cancellation behaves as in Sync.
func (e *Engine) Backfill(ctx context.Context, r backstop.Resource, restart bool) (backstop.RunStats, error) {
	cur, ok, err := e.Mirror.Cursor(ctx, r, backstop.CursorBackfill)
	if err != nil {
		return backstop.RunStats{Resource: r}, fmt.Errorf("backfill %s: %w", r, err)
	}
	switch {
	case ok && cur.Done && !restart:
		e.logger().Info("backfill already finished; --restart reads everything again", "resource", r,
			"finished_at", cur.UpdatedAt, "position", cur.Position)
		return backstop.RunStats{Resource: r}, nil
	case !ok || restart:
		if ok && !cur.Done {
			e.logger().Info("discarding unfinished backfill checkpoint", "resource", r, "position", cur.Position)
		}
		cur = backstop.Cursor{Resource: r, Kind: backstop.CursorBackfill}
	case cur.Value != "":
		e.logger().Info("resuming backfill", "resource", r, "position", cur.Position)
	}
	st, last, err := e.pages(ctx, cur, "backfill")
	if err != nil {
		return st, err
	}
	handoff := last
	handoff.Kind = backstop.CursorSync
	handoff.Done = false
	// The hand-off is a bookkeeping step of a finished run: it is not
	// abandoned because the user pressed Ctrl-C just now.
	moved, err := e.Mirror.AdvanceCursor(context.WithoutCancel(ctx), handoff)
	if err != nil {
		return st, fmt.Errorf("backfill %s: hand position to sync cursor: %w", r, err)
	}
	if moved {
		e.logger().Info("sync cursor moved to the end of the backfill", "resource", r, "position", last.Position)
	}
	return st, nil
}

// pages walks the feed from cur until has_more is false, saving cur's kind.
// It returns the last cursor saved.
func (e *Engine) pages(ctx context.Context, cur backstop.Cursor, op string) (st backstop.RunStats, _ backstop.Cursor, _ error) {
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
		res, err := e.Mirror.ApplyPage(context.WithoutCancel(ctx), page.Objects, next)
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
