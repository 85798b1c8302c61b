package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/backstop-sync/backstop"
)

// cursorColumns are the columns of cursors in the order cursorRow lists them
// (and cursorRow.args gives them).
const cursorColumns = `resource, kind, value, pos_updated_at, pos_id, done, updated_at, started_at`

// upsertCursorSQL saves a cursor unconditionally; the statements below add
// the condition under which an existing row is replaced. Canonical times are
// fixed width, so the row-value comparison of text is the feed order
// (updated_at, then id). started_at keeps the earliest start saved: it is
// when the backfill that began the checkpoint started, and a resumed run
// (or one that overlaps it, such as a hand-run backfill beside serve's
// job, whichever commits first) must not move it forward; only a reset,
// which deletes the row, starts a new one.
const upsertCursorSQL = `INSERT INTO cursors (` + cursorColumns + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
	ON CONFLICT (resource, kind) DO UPDATE SET
		value = excluded.value,
		pos_updated_at = excluded.pos_updated_at,
		pos_id = excluded.pos_id,
		done = excluded.done,
		updated_at = excluded.updated_at,
		started_at = CASE WHEN cursors.started_at IS NULL OR excluded.started_at < cursors.started_at
			THEN excluded.started_at ELSE cursors.started_at END`

// saveCursorSQL is the cursor save of a page commit (ApplyPage, EmitPage):
// it saves a cursor when none is saved or the saved position is not after
// the new one, so a page commit never moves a cursor back, whoever saved it
// (two syncs of one resource that overlap, a scheduled one and one started
// by hand). At an equal position it saves, which records Done and the time
// of a page that read nothing new.
const saveCursorSQL = upsertCursorSQL + `
	WHERE (excluded.pos_updated_at, excluded.pos_id) >= (cursors.pos_updated_at, cursors.pos_id)`

// advanceCursorSQL saves a cursor only when none is saved or the saved
// position is before the new one.
const advanceCursorSQL = upsertCursorSQL + `
	WHERE (excluded.pos_updated_at, excluded.pos_id) > (cursors.pos_updated_at, cursors.pos_id)`

// cursorRow is one row of cursors.
type cursorRow struct {
	Resource     string         `db:"resource"`
	Kind         string         `db:"kind"`
	Value        string         `db:"value"`
	PosUpdatedAt string         `db:"pos_updated_at"`
	PosID        string         `db:"pos_id"`
	Done         bool           `db:"done"`
	UpdatedAt    string         `db:"updated_at"`
	StartedAt    sql.NullString `db:"started_at"` // NULL when unknown
}

func newCursorRow(c backstop.Cursor, now time.Time) cursorRow {
	return cursorRow{
		Resource:     string(c.Resource),
		Kind:         string(c.Kind),
		Value:        c.Value,
		PosUpdatedAt: backstop.CanonicalTime(c.Position.UpdatedAt),
		PosID:        c.Position.ID,
		Done:         c.Done,
		UpdatedAt:    backstop.CanonicalTime(now),
		StartedAt:    sql.NullString{String: backstop.CanonicalTime(c.StartedAt), Valid: !c.StartedAt.IsZero()},
	}
}

// args are the values of row for the placeholders of upsertCursorSQL, in
// cursorColumns' order.
func (row cursorRow) args() []any {
	return []any{row.Resource, row.Kind, row.Value, row.PosUpdatedAt, row.PosID, row.Done, row.UpdatedAt, row.StartedAt}
}

func (row cursorRow) cursor() (backstop.Cursor, error) {
	pos, err := backstop.ParseTime(row.PosUpdatedAt)
	if err != nil {
		return backstop.Cursor{}, fmt.Errorf("cursor %s/%s: position: %w", row.Resource, row.Kind, err)
	}
	upd, err := backstop.ParseTime(row.UpdatedAt)
	if err != nil {
		return backstop.Cursor{}, fmt.Errorf("cursor %s/%s: updated_at: %w", row.Resource, row.Kind, err)
	}
	var started time.Time
	if row.StartedAt.Valid {
		if started, err = backstop.ParseTime(row.StartedAt.String); err != nil {
			return backstop.Cursor{}, fmt.Errorf("cursor %s/%s: started_at: %w", row.Resource, row.Kind, err)
		}
	}
	return backstop.Cursor{
		Resource:  backstop.Resource(row.Resource),
		Kind:      backstop.CursorKind(row.Kind),
		Value:     row.Value,
		Position:  backstop.Position{UpdatedAt: pos, ID: row.PosID},
		Done:      row.Done,
		UpdatedAt: upd,
		StartedAt: started,
	}, nil
}

// checkKind rejects a cursor kind other than CursorSync and CursorBackfill.
func checkKind(k backstop.CursorKind) error {
	switch k {
	case backstop.CursorSync, backstop.CursorBackfill:
		return nil
	}
	return fmt.Errorf("unknown cursor kind %q", k)
}

// checkCursor rejects a cursor of an unknown resource or kind.
func checkCursor(c backstop.Cursor) error {
	if _, err := tableFor(c.Resource); err != nil {
		return fmt.Errorf("cursor: %w", err)
	}
	if err := checkKind(c.Kind); err != nil {
		return fmt.Errorf("cursor: %w", err)
	}
	return nil
}

// Cursor returns the saved cursor of r and kind, or ok=false when none is
// saved. The returned UpdatedAt is when it was last saved, and StartedAt
// the first one saved with it since it was created (zero when none was).
func (db *DB) Cursor(ctx context.Context, r backstop.Resource, kind backstop.CursorKind) (backstop.Cursor, bool, error) {
	if err := checkCursor(backstop.Cursor{Resource: r, Kind: kind}); err != nil {
		return backstop.Cursor{}, false, fmt.Errorf("read %w", err)
	}
	var row cursorRow
	err := db.r.GetContext(ctx, &row, `SELECT `+cursorColumns+` FROM cursors WHERE resource = ? AND kind = ?`,
		string(r), string(kind))
	if errors.Is(err, sql.ErrNoRows) {
		return backstop.Cursor{}, false, nil
	}
	if err != nil {
		return backstop.Cursor{}, false, fmt.Errorf("read cursor %s/%s: %w", r, kind, err)
	}
	c, err := row.cursor()
	if err != nil {
		return backstop.Cursor{}, false, fmt.Errorf("read %w", err)
	}
	return c, true, nil
}

// Cursors returns every saved cursor, ordered by resource, then kind.
func (db *DB) Cursors(ctx context.Context) ([]backstop.Cursor, error) {
	var rows []cursorRow
	if err := db.r.SelectContext(ctx, &rows,
		`SELECT `+cursorColumns+` FROM cursors ORDER BY resource, kind`); err != nil {
		return nil, fmt.Errorf("list cursors: %w", err)
	}
	out := make([]backstop.Cursor, len(rows))
	for i, row := range rows {
		c, err := row.cursor()
		if err != nil {
			return nil, fmt.Errorf("list cursors: %w", err)
		}
		out[i] = c
	}
	return out, nil
}

// AdvanceCursor saves cur only when no cursor of its resource and kind is
// saved or the saved one's Position is before cur.Position; a cursor is
// never moved back or re-saved at the same position. It reports whether it
// saved. It fails on an unknown resource or kind.
func (db *DB) AdvanceCursor(ctx context.Context, cur backstop.Cursor) (bool, error) {
	if err := checkCursor(cur); err != nil {
		return false, fmt.Errorf("advance %w", err)
	}
	row := newCursorRow(cur, db.now())
	res, err := db.w.ExecContext(ctx, advanceCursorSQL, row.args()...)
	if err != nil {
		return false, fmt.Errorf("advance cursor %s/%s: %w", cur.Resource, cur.Kind, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("advance cursor %s/%s: %w", cur.Resource, cur.Kind, err)
	}
	return n > 0, nil
}

// cursorGenerationSQL reads how many times a cursor was reset (0 when never).
const cursorGenerationSQL = `SELECT coalesce((SELECT generation FROM cursor_resets WHERE resource = ? AND kind = ?), 0)`

// bumpGenerationSQL counts one more reset of a cursor.
const bumpGenerationSQL = `INSERT INTO cursor_resets (resource, kind, generation, reset_at) VALUES (?, ?, 1, ?)
	ON CONFLICT (resource, kind) DO UPDATE SET generation = generation + 1, reset_at = excluded.reset_at`

// CursorGeneration returns what Cursor returns and, read together with it,
// the cursor's reset generation: the number of times it was reset
// (ResetCursor, ResetCursors). A run that pages from the cursor passes the
// generation to ApplyPageAt or EmitPageAt, whose commits are refused once
// the cursor has been reset since, so a reset is never undone by a run
// that started before it.
func (db *DB) CursorGeneration(ctx context.Context, r backstop.Resource, kind backstop.CursorKind) (backstop.Cursor, bool, int64, error) {
	if err := checkCursor(backstop.Cursor{Resource: r, Kind: kind}); err != nil {
		return backstop.Cursor{}, false, 0, fmt.Errorf("read %w", err)
	}
	// One read transaction: the cursor and its generation are one snapshot.
	tx, err := db.r.BeginTxx(ctx, nil)
	if err != nil {
		return backstop.Cursor{}, false, 0, fmt.Errorf("read cursor %s/%s: begin: %w", r, kind, err)
	}
	defer tx.Rollback()
	var gen int64
	if err := tx.GetContext(ctx, &gen, cursorGenerationSQL, string(r), string(kind)); err != nil {
		return backstop.Cursor{}, false, 0, fmt.Errorf("read cursor %s/%s generation: %w", r, kind, err)
	}
	var row cursorRow
	err = tx.GetContext(ctx, &row, `SELECT `+cursorColumns+` FROM cursors WHERE resource = ? AND kind = ?`,
		string(r), string(kind))
	if errors.Is(err, sql.ErrNoRows) {
		return backstop.Cursor{}, false, gen, nil
	}
	if err != nil {
		return backstop.Cursor{}, false, 0, fmt.Errorf("read cursor %s/%s: %w", r, kind, err)
	}
	c, err := row.cursor()
	if err != nil {
		return backstop.Cursor{}, false, 0, fmt.Errorf("read %w", err)
	}
	return c, true, gen, nil
}

// sameGeneration reports, inside the write transaction tx, whether the
// cursor of cur's resource and kind has not been reset since a run read
// it at generation gen.
func sameGeneration(ctx context.Context, tx *sqlx.Tx, cur backstop.Cursor, gen int64) (bool, error) {
	var now int64
	if err := tx.GetContext(ctx, &now, cursorGenerationSQL, string(cur.Resource), string(cur.Kind)); err != nil {
		return false, fmt.Errorf("read cursor generation: %w", err)
	}
	return now == gen, nil
}

// EmitPageAt is EmitPage for a run that read its cursor at reset
// generation gen (CursorGeneration): when the cursor has been reset since,
// it commits nothing, neither the events nor the cursor, and reports
// reset=true, so the run stops instead of writing its position over the
// reset.
func (db *DB) EmitPageAt(ctx context.Context, gen int64, events []backstop.Event, routes []backstop.Route, cur backstop.Cursor) (_ []backstop.EmitResult, reset bool, _ error) {
	_, out, reset, err := db.emitPageAt(ctx, gen, nil, events, routes, cur)
	if err != nil {
		return nil, false, fmt.Errorf("emit %s page: %w", cur.Resource, err)
	}
	return out, reset, nil
}

// ApplyEmitPageAt commits a page of a backfill that emits only part of
// it: the objects of silent are written to the mirror without events, as
// ApplyPage writes them (each only when newer), and events go through the
// emit path as EmitPageAt's do, with the cursor, in one transaction; it
// commits nothing and reports reset=true when the cursor was reset since
// the run read it at gen. The ApplyResult counts silent's objects against
// the mirror as it was.
func (db *DB) ApplyEmitPageAt(ctx context.Context, gen int64, silent []backstop.Object, events []backstop.Event, routes []backstop.Route, cur backstop.Cursor) (_ backstop.ApplyResult, _ []backstop.EmitResult, reset bool, _ error) {
	res, out, reset, err := db.emitPageAt(ctx, gen, silent, events, routes, cur)
	if err != nil {
		return backstop.ApplyResult{}, nil, false, fmt.Errorf("apply %s page: %w", cur.Resource, err)
	}
	return res, out, reset, nil
}

// OldestEventAt returns when the oldest processed event of r kept was
// received (ok=false when none is kept): since when backstop has recorded
// r's events, as far as the retention (30 days) lets it tell.
func (db *DB) OldestEventAt(ctx context.Context, r backstop.Resource) (_ time.Time, ok bool, _ error) {
	var at []string
	// Whether r has any event, through the dedup_key index ("r:id:time"),
	// before reading the received_at index in order to r's first: that
	// read would go through every event of the other resources when r
	// has none.
	var some []int
	if err := db.r.SelectContext(ctx, &some, `SELECT 1 FROM processed_events
		WHERE dedup_key >= ? AND dedup_key < ? LIMIT 1`, string(r)+":", string(r)+";"); err != nil {
		return time.Time{}, false, fmt.Errorf("read the oldest %s event: %w", r, err)
	}
	if len(some) > 0 {
		if err := db.r.SelectContext(ctx, &at, `SELECT received_at FROM processed_events
			WHERE resource = ? ORDER BY received_at LIMIT 1`, string(r)); err != nil {
			return time.Time{}, false, fmt.Errorf("read the oldest %s event: %w", r, err)
		}
	}
	if len(at) == 0 {
		return time.Time{}, false, nil
	}
	t, err := backstop.ParseTime(at[0])
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read the oldest %s event: %w", r, err)
	}
	return t, true, nil
}

// anyGeneration is the generation emitPageAt takes to commit whatever the
// cursor's reset generation (EmitPage).
const anyGeneration = -1

// emitPageAt is ApplyEmitPageAt, EmitPageAt with silent nil, and EmitPage
// with gen anyGeneration.
func (db *DB) emitPageAt(ctx context.Context, gen int64, silent []backstop.Object, events []backstop.Event, routes []backstop.Route, cur backstop.Cursor) (backstop.ApplyResult, []backstop.EmitResult, bool, error) {
	var res backstop.ApplyResult
	if err := checkCursor(cur); err != nil {
		return res, nil, false, err
	}
	if err := checkRoutes(routes); err != nil {
		return res, nil, false, err
	}
	now := db.now()
	stamp := backstop.CanonicalTime(now)

	tx, err := db.w.BeginTxx(ctx, nil)
	if err != nil {
		return res, nil, false, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()

	// As in EmitPage: statements run without ctx's cancellation; ctx is
	// checked between events and by the commit.
	sctx := context.WithoutCancel(ctx)
	if gen != anyGeneration {
		if ok, err := sameGeneration(sctx, tx, cur, gen); err != nil {
			return res, nil, false, err
		} else if !ok {
			return res, nil, true, nil
		}
	}
	if len(silent) > 0 {
		if res, err = db.mirrorWriter(tx, now).apply(sctx, silent); err != nil {
			return backstop.ApplyResult{}, nil, false, err
		}
	}
	// The run compared the page with the mirror before this transaction;
	// a webhook's newer version of an object committed since leaves the
	// run's older one out (EmitSuperseded) instead of queueing it after.
	out, err := db.emitNewerInTx(ctx, sctx, tx, now, stamp, events, routes)
	if err != nil {
		return backstop.ApplyResult{}, nil, false, err
	}
	row := newCursorRow(cur, now)
	// saveCursor never moves the cursor back (saveCursorSQL).
	if _, err := tx.StmtxContext(sctx, db.saveCursor).ExecContext(sctx, row.args()...); err != nil {
		return backstop.ApplyResult{}, nil, false, fmt.Errorf("save cursor: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return backstop.ApplyResult{}, nil, false, fmt.Errorf("commit %d events and cursor: %w", len(events), err)
	}
	return res, out, false, nil
}

// ResetCursor deletes the saved cursor of r and kind, so that the next
// page commit of that kind saves whatever position it reaches: page commits
// never move a saved cursor back, and this is how a run that means to start
// over (backfill --restart) does; with the row goes the checkpoint's
// StartedAt, which page commits otherwise keep, so the next backfill saves
// its own start. It also counts the reset (the cursor's
// generation, see CursorGeneration), so a run that read the cursor before
// can no longer save over it. Deleting a cursor that does not exist is not
// an error. It fails on an unknown resource or kind.
func (db *DB) ResetCursor(ctx context.Context, r backstop.Resource, kind backstop.CursorKind) error {
	if err := checkCursor(backstop.Cursor{Resource: r, Kind: kind}); err != nil {
		return fmt.Errorf("reset %w", err)
	}
	if err := db.resetCursors(ctx, r, kind); err != nil {
		return fmt.Errorf("reset cursor %s/%s: %w", r, kind, err)
	}
	return nil
}

// ResetCursors deletes both cursors (sync and backfill) of r, so the next
// sync and backfill start from the beginning, and counts the reset of each
// (see ResetCursor): a sync or backfill of r running meanwhile stops at its
// next page instead of saving its position over the reset. Deleting
// cursors that do not exist is not an error.
func (db *DB) ResetCursors(ctx context.Context, r backstop.Resource) error {
	if _, err := tableFor(r); err != nil {
		return fmt.Errorf("reset cursors: %w", err)
	}
	if err := db.resetCursors(ctx, r, backstop.CursorSync, backstop.CursorBackfill); err != nil {
		return fmt.Errorf("reset cursors %s: %w", r, err)
	}
	return nil
}

// resetCursors deletes r's cursors of kinds and counts their resets, in
// one transaction.
func (db *DB) resetCursors(ctx context.Context, r backstop.Resource, kinds ...backstop.CursorKind) error {
	tx, err := db.w.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	stamp := backstop.CanonicalTime(db.now())
	for _, kind := range kinds {
		if _, err := tx.ExecContext(ctx, `DELETE FROM cursors WHERE resource = ? AND kind = ?`,
			string(r), string(kind)); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, bumpGenerationSQL, string(r), string(kind), stamp); err != nil {
			return fmt.Errorf("count the reset: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// CheckpointEmitted reports whether the backfill that saved checkpoint
// chk emitted its events. A backfill's page and its events commit
// together, and on a first fill the objects are new, so an emitting
// backfill interrupted at any point leaves events of origin backfill
// behind: first the last object before chk (its Position) is looked up,
// one lookup on the dedup key. When that version came by webhook before
// the backfill read it (its event is the webhook's), any event of origin
// backfill of chk's resource is looked for instead: a scan of
// processed_events, made only then, stopping at the first. (One an
// earlier backfill left, within the 30 days events are kept, also counts:
// the guards then refuse rather than risk losing events.)
func (db *DB) CheckpointEmitted(ctx context.Context, chk backstop.Cursor) (bool, error) {
	if err := checkCursor(chk); err != nil {
		return false, fmt.Errorf("read %w", err)
	}
	if chk.Position.ID == "" {
		return false, nil // nothing read yet
	}
	var n int
	if err := db.r.GetContext(ctx, &n, `SELECT count(*) FROM processed_events WHERE dedup_key = ? AND origin = ?`,
		backstop.DedupKey(chk.Resource, chk.Position.ID, chk.Position.UpdatedAt), string(backstop.OriginBackfill)); err != nil {
		return false, fmt.Errorf("read checkpoint %s/%s events: %w", chk.Resource, chk.Kind, err)
	}
	if n > 0 {
		return true, nil
	}
	if err := db.r.GetContext(ctx, &n, `SELECT count(*) FROM (SELECT 1 FROM processed_events WHERE resource = ? AND origin = ? LIMIT 1)`,
		string(chk.Resource), string(backstop.OriginBackfill)); err != nil {
		return false, fmt.Errorf("read %s backfill events: %w", chk.Resource, err)
	}
	return n > 0, nil
}
