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

// Versions returns the mirrored updated_at of those of ids that are in r's
// mirror table, keyed by id; ids not in the mirror are absent from the map.
// Up to 500 ids are read with one query (a feed page is at most 200). It
// fails on an unknown resource.
func (db *DB) Versions(ctx context.Context, r backstop.Resource, ids []string) (map[string]time.Time, error) {
	t, err := tableFor(r)
	if err != nil {
		return nil, fmt.Errorf("read versions: %w", err)
	}
	out := make(map[string]time.Time, len(ids))
	for start := 0; start < len(ids); start += maxIn {
		chunk := ids[start:min(start+maxIn, len(ids))]
		args := make([]any, len(chunk))
		for i, id := range chunk {
			args[i] = id
		}
		if err := db.readVersions(ctx, t, args, out); err != nil {
			return nil, fmt.Errorf("read %s versions: %w", r, err)
		}
	}
	return out, nil
}

func (db *DB) readVersions(ctx context.Context, t *table, args []any, out map[string]time.Time) error {
	rows, err := db.r.QueryxContext(ctx, t.existSQL+placeholders(len(args))+")", args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var v versionRow
		if err := rows.StructScan(&v); err != nil {
			return err
		}
		ts, err := backstop.ParseTime(v.UpdatedAt)
		if err != nil {
			return fmt.Errorf("%s: updated_at: %w", v.ID, err)
		}
		out[v.ID] = ts
	}
	return rows.Err()
}

// EmitChanged is Emit for events that announce the platform's current
// state of objects the caller found missing from the mirror or behind it
// (reconcile's). The caller compared before the emit, and a webhook may
// have brought a newer version of an object since: in the same
// transaction as the emit path, each event whose object the mirror now
// holds in a version newer than the event's is left out as backstop.EmitSuperseded,
// so that an older state is never queued after a newer one was. The
// others go through the emit path exactly as in Emit (the same version
// already processed is an EmitDuplicate there). Results are in the order
// of events; on error nothing is committed.
func (db *DB) EmitChanged(ctx context.Context, events []backstop.Event, routes []backstop.Route) ([]backstop.EmitResult, error) {
	if len(events) == 0 {
		return []backstop.EmitResult{}, nil
	}
	res, err := db.emit(ctx, events, routes, db.emitNewerInTx)
	if err != nil {
		return nil, fmt.Errorf("emit: %w", err)
	}
	return res, nil
}

// emitNewerInTx is emitInTx for events whose objects the caller compared
// with the mirror before its transaction: each event whose object the
// mirror holds, read in tx, in a version newer than the event's is left
// out as backstop.EmitSuperseded, and the others go through emitInTx.
// Results are in the order of events.
func (db *DB) emitNewerInTx(ctx, sctx context.Context, tx *sqlx.Tx, now time.Time, stamp string, events []backstop.Event, routes []backstop.Route) ([]backstop.EmitResult, error) {
	// Checked first, as emitInTx would, so that an event the versions
	// cannot be read for is named by its position and id.
	for i, ev := range events {
		if err := checkEvent(ev); err != nil {
			return nil, fmt.Errorf("event %d of %d (%s): %w", i+1, len(events), ev.ID, err)
		}
	}
	stored, err := eventVersions(sctx, tx, events)
	if err != nil {
		return nil, err
	}
	out := make([]backstop.EmitResult, len(events))
	keep := make([]backstop.Event, 0, len(events))
	at := make([]int, 0, len(events))
	for i, ev := range events {
		if _, ok := ev.Object(); ok {
			// Canonical times are fixed width: text order is time order.
			if v, ok := stored[ev.Resource][ev.ObjectID]; ok && v > backstop.CanonicalTime(ev.UpdatedAt) {
				out[i] = backstop.EmitResult{Status: backstop.EmitSuperseded}
				continue
			}
		}
		keep = append(keep, ev)
		at = append(at, i)
	}
	res, err := db.emitInTx(ctx, sctx, tx, now, stamp, keep, routes)
	if err != nil {
		return nil, err
	}
	for j, i := range at {
		out[i] = res[j]
	}
	return out, nil
}

// eventVersions reads in tx the mirrored canonical updated_at of the
// objects events carry, by resource and id.
func eventVersions(ctx context.Context, tx *sqlx.Tx, events []backstop.Event) (map[backstop.Resource]map[string]string, error) {
	objs := make(map[backstop.Resource][]backstop.Object)
	for _, ev := range events {
		if o, ok := ev.Object(); ok {
			objs[o.Resource] = append(objs[o.Resource], o)
		}
	}
	out := make(map[backstop.Resource]map[string]string, len(objs))
	for r, os := range objs {
		t, err := tableFor(r)
		if err != nil {
			return nil, err
		}
		if out[r], err = storedVersions(ctx, tx, t, os); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ReconcileStaleAfter is how long a reconcile run may go without a
// heartbeat before a "running" row is taken for one whose process died
// (SIGKILL, a crash, a power loss) and closed as "abandoned".
//
// A run that is alive beats at its start and after every page
// (ReconcileHeartbeat), and a page takes seconds, at worst a few minutes
// when the rate-limit governor waits for the next window or a 429 pauses
// the key (capped at a minute) and retries back off: an hour without a
// beat is far beyond any live run, also one in another process sharing
// this store, so such a run is never closed under it. A run of a process
// of this host that is gone (ownerGone) is closed at once, whatever its
// heartbeat; for one of another host, or of an older binary (no owner),
// nothing else tells a live run from a dead one.
const ReconcileStaleAfter = time.Hour

// abandonSQL closes the running runs whose last heartbeat is before the
// second parameter, of the resource given as the third (all when it is
// empty); the first is now.
const abandonSQL = `UPDATE reconcile_runs SET status = 'abandoned', finished_at = ?1,
		error = 'abandoned: no heartbeat since ' || heartbeat_at || ' (its process was killed or crashed)'
	WHERE status = 'running' AND heartbeat_at < ?2 AND (?3 = '' OR resource = ?3)`

// abandonStale closes, in tx, the stale running runs of r (of every
// resource when r is empty), deletes their seen marks and returns how many
// it closed.
func (db *DB) abandonStale(ctx context.Context, tx *sqlx.Tx, r backstop.Resource) (int64, error) {
	now := db.now()
	res, err := tx.ExecContext(ctx, abandonSQL, backstop.CanonicalTime(now),
		backstop.CanonicalTime(now.Add(-ReconcileStaleAfter)), string(r))
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return n, err
	}
	gone, err := db.abandonGoneReconciles(ctx, tx, r, now)
	if err != nil {
		return n, err
	}
	if n += gone; n == 0 {
		return 0, nil
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM reconcile_seen WHERE run_id IN
		(SELECT id FROM reconcile_runs WHERE status = 'abandoned')`); err != nil {
		return 0, err
	}
	return n, nil
}

// abandonGoneReconcileSQL closes the running run ?2, whose process is gone
// (ownerGone), saying which process that was (?3), as abandonGoneJobRunSQL
// does for a job run.
const abandonGoneReconcileSQL = `UPDATE reconcile_runs SET status = 'abandoned', finished_at = ?1,
		error = 'abandoned: its process (' || ?3 || ') is gone; last heartbeat ' || heartbeat_at
	WHERE id = ?2 AND status = 'running'`

// abandonGoneReconciles closes, in tx, the running runs of r (of every
// resource when r is empty) whose process is known to be gone (ownerGone:
// it ran on this host and was killed), whatever their heartbeat, and
// returns how many it closed.
func (db *DB) abandonGoneReconciles(ctx context.Context, tx *sqlx.Tx, r backstop.Resource, now time.Time) (int64, error) {
	var running []struct {
		ID    int64  `db:"id"`
		Owner string `db:"owner"`
	}
	if err := tx.SelectContext(ctx, &running, `SELECT id, owner FROM reconcile_runs
		WHERE status = 'running' AND owner IS NOT NULL AND (?1 = '' OR resource = ?1)`, string(r)); err != nil {
		return 0, err
	}
	var n int64
	for _, run := range running {
		o, gone := ownerGone(run.Owner)
		if !gone {
			continue
		}
		res, err := tx.ExecContext(ctx, abandonGoneReconcileSQL, backstop.CanonicalTime(now), run.ID, o.process())
		if err != nil {
			return n, err
		}
		k, err := res.RowsAffected()
		if err != nil {
			return n, err
		}
		n += k
	}
	return n, nil
}

// AbandonStaleReconciles closes as "abandoned" every "running" reconcile
// run of any resource whose last heartbeat is more than
// ReconcileStaleAfter old, or whose process ran on this host and is gone:
// its process died without finishing it. It deletes their seen marks and
// returns how many runs it closed.
// Maintenance runs it; StartReconcile does the same for its resource.
func (db *DB) AbandonStaleReconciles(ctx context.Context) (int64, error) {
	tx, err := db.w.BeginTxx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("abandon stale reconcile runs: begin: %w", err)
	}
	defer tx.Rollback()
	n, err := db.abandonStale(ctx, tx, "")
	if err != nil {
		return 0, fmt.Errorf("abandon stale reconcile runs: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("abandon stale reconcile runs: commit: %w", err)
	}
	return n, nil
}

// ReconcileHeartbeat records that run runID is still going, so that it is
// not taken for abandoned (ReconcileStaleAfter). A run no longer running
// (closed as abandoned while it went on, a page having taken over
// ReconcileStaleAfter) is left alone and an error says so: the run must
// stop, since its seen marks are gone and its orphan count would be
// wrong. It returns ErrNotFound when there is no run runID.
func (db *DB) ReconcileHeartbeat(ctx context.Context, runID int64) error {
	return db.reconcileBeat(ctx, runID, "")
}

// ReconcileProgress is ReconcileHeartbeat that also stores rep's counts so
// far (pages, scanned, missing, behind, re-emitted, suppressed, requests,
// 429s and duration), so that a running run shows how far it got, and a
// run whose process died (closed as abandoned) shows what it did up to its
// last page: the events it re-emitted were queued.
func (db *DB) ReconcileProgress(ctx context.Context, runID int64, rep backstop.ReconcileReport) error {
	return db.reconcileBeat(ctx, runID, `, pages = ?, scanned = ?, missing = ?, behind = ?,
		reemitted = ?, suppressed = ?, requests = ?, rate_limited = ?, duration_ms = ?`,
		rep.Pages, rep.Scanned, rep.Missing, rep.Behind, rep.Reemitted, rep.Suppressed,
		rep.Requests, rep.RateLimited, rep.Duration.Milliseconds())
}

// reconcileBeat beats run runID's heartbeat, also setting set (", col = ?…"
// with its args) when it is not empty.
func (db *DB) reconcileBeat(ctx context.Context, runID int64, set string, args ...any) error {
	args = append(append([]any{backstop.CanonicalTime(db.now())}, args...), runID)
	res, err := db.w.ExecContext(ctx, `UPDATE reconcile_runs SET heartbeat_at = ?`+set+`
		WHERE id = ? AND status = 'running'`, args...)
	if err != nil {
		return fmt.Errorf("reconcile %d heartbeat: %w", runID, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("reconcile %d heartbeat: %w", runID, err)
	} else if n == 0 {
		var status []string
		if err := db.r.SelectContext(ctx, &status, `SELECT status FROM reconcile_runs WHERE id = ?`, runID); err != nil {
			return fmt.Errorf("reconcile %d heartbeat: %w", runID, err)
		}
		if len(status) == 0 {
			return fmt.Errorf("reconcile %d heartbeat: %w", runID, backstop.ErrNotFound)
		}
		return fmt.Errorf("reconcile run %d was closed as %s while it went on (no heartbeat for %s): stopping it", runID, status[0], ReconcileStaleAfter)
	}
	return nil
}

// StartReconcile records the start of a reconcile run described by rep
// (Resource, StartedAt, Since, Full, DryRun) with status "running" and its
// first heartbeat, and returns its id, which ReconcileHeartbeat, MarkSeen,
// CountOrphans and FinishReconcile take. In the same transaction it closes
// the stale running runs of the resource as AbandonStaleReconciles does, so
// a run killed with SIGKILL is closed by the next reconcile of its
// resource. A zero StartedAt is stored as now. It fails on an unknown
// resource.
func (db *DB) StartReconcile(ctx context.Context, rep backstop.ReconcileReport) (int64, error) {
	id, err := db.startReconcile(ctx, rep)
	if err != nil {
		return 0, fmt.Errorf("start reconcile %s: %w", rep.Resource, err)
	}
	return id, nil
}

func (db *DB) startReconcile(ctx context.Context, rep backstop.ReconcileReport) (int64, error) {
	if _, err := tableFor(rep.Resource); err != nil {
		return 0, err
	}
	now := db.now()
	started := rep.StartedAt
	if started.IsZero() {
		started = now
	}
	tx, err := db.w.BeginTxx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	if _, err := db.abandonStale(ctx, tx, rep.Resource); err != nil {
		return 0, fmt.Errorf("abandon stale runs: %w", err)
	}
	res, err := tx.ExecContext(ctx, `INSERT INTO reconcile_runs (resource, started_at, window_since, full, dry_run,
		heartbeat_at, owner) VALUES (?, ?, ?, ?, ?, ?, ?)`, string(rep.Resource), backstop.CanonicalTime(started),
		nullTime(rep.Since), rep.Full, rep.DryRun, backstop.CanonicalTime(now), processOwner().String())
	if err != nil {
		return 0, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	return id, nil
}

// MarkSeen records that run runID saw ids upstream, for CountOrphans. Ids
// already marked are ignored. The marks are deleted by CountOrphans and by
// FinishReconcile.
func (db *DB) MarkSeen(ctx context.Context, runID int64, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	tx, err := db.w.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("mark seen: begin: %w", err)
	}
	defer tx.Rollback()
	const rowsPerInsert = maxIn / 2 // two parameters per row
	args := make([]any, 0, 2*rowsPerInsert)
	for start := 0; start < len(ids); start += rowsPerInsert {
		chunk := ids[start:min(start+rowsPerInsert, len(ids))]
		args = args[:0]
		q := make([]byte, 0, 64+8*len(chunk))
		q = append(q, `INSERT OR IGNORE INTO reconcile_seen (run_id, id) VALUES `...)
		for i, id := range chunk {
			if i > 0 {
				q = append(q, ", "...)
			}
			q = append(q, "(?, ?)"...)
			args = append(args, runID, id)
		}
		if _, err := tx.ExecContext(ctx, string(q), args...); err != nil {
			return fmt.Errorf("mark seen for run %d: %w", runID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("mark seen for run %d: commit: %w", runID, err)
	}
	return nil
}

// CountOrphans returns how many objects of r's mirror run runID has not
// marked seen — objects the platform no longer returns, when the run read
// the whole feed — and deletes the run's marks, in one transaction. It
// fails on an unknown resource.
func (db *DB) CountOrphans(ctx context.Context, runID int64, r backstop.Resource) (int, error) {
	t, err := tableFor(r)
	if err != nil {
		return 0, fmt.Errorf("count orphans: %w", err)
	}
	tx, err := db.w.BeginTxx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("count %s orphans: begin: %w", r, err)
	}
	defer tx.Rollback()
	var n int
	if err := tx.GetContext(ctx, &n, `SELECT count(*) FROM `+t.name+` AS m
		WHERE NOT EXISTS (SELECT 1 FROM reconcile_seen AS s WHERE s.run_id = ? AND s.id = m.id)`, runID); err != nil {
		return 0, fmt.Errorf("count %s orphans: %w", r, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM reconcile_seen WHERE run_id = ?`, runID); err != nil {
		return 0, fmt.Errorf("count %s orphans: clear marks: %w", r, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("count %s orphans: commit: %w", r, err)
	}
	return n, nil
}

// FinishReconcile completes run runID with rep's counts, its cost and
// duration, and status "ok" when rep.Err is nil, "interrupted" when it is
// a cancellation (context.Canceled) or "failed", with the error's text; it
// deletes the run's remaining seen marks. It returns ErrNotFound when there
// is no run runID.
func (db *DB) FinishReconcile(ctx context.Context, runID int64, rep backstop.ReconcileReport) error {
	status, errText := "ok", sql.NullString{}
	switch {
	case errors.Is(rep.Err, context.Canceled):
		status, errText = "interrupted", sql.NullString{String: rep.Err.Error(), Valid: true}
	case rep.Err != nil:
		status, errText = "failed", sql.NullString{String: rep.Err.Error(), Valid: true}
	}
	tx, err := db.w.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("finish reconcile %d: begin: %w", runID, err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `UPDATE reconcile_runs SET finished_at = ?, pages = ?, scanned = ?,
		missing = ?, behind = ?, reemitted = ?, suppressed = ?, orphans = ?, requests = ?, rate_limited = ?,
		duration_ms = ?, status = ?, error = ? WHERE id = ?`,
		backstop.CanonicalTime(db.now()), rep.Pages, rep.Scanned, rep.Missing, rep.Behind, rep.Reemitted,
		rep.Suppressed, rep.Orphans, rep.Requests, rep.RateLimited, rep.Duration.Milliseconds(),
		status, errText, runID)
	if err != nil {
		return fmt.Errorf("finish reconcile %d: %w", runID, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("finish reconcile %d: %w", runID, err)
	} else if n == 0 {
		return fmt.Errorf("finish reconcile %d: %w", runID, backstop.ErrNotFound)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM reconcile_seen WHERE run_id = ?`, runID); err != nil {
		return fmt.Errorf("finish reconcile %d: clear marks: %w", runID, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("finish reconcile %d: commit: %w", runID, err)
	}
	return nil
}

// windowRuns is how many of a resource's latest successful, non-dry
// reconcile runs LastReconcile looks at for a gap. A gap is closed by the
// next default run, which reaches back over it, so only runs by hand with
// narrow windows and no default run after them leave one open: 10,000 of
// them are over a year of hourly runs, and reading them takes milliseconds.
const windowRuns = 10000

// windowStartSQL selects the id and start of the run the default window of
// the resource given as the first parameter starts from: of its latest
// successful, non-dry reconcile runs (as many as the second parameter,
// windowRuns), the earliest whose start no later run reached back to (no
// later run's window_since, NULL for a full run, is at or before it). A run compares the feed's objects updated
// between its window's start and its own start; where a later run's window
// begins after an earlier run's start, the time between was compared by
// no run. With no gap it is the last run. A run whose window began after
// its own start (a --since in the future) compared nothing and is left
// out: it never reaches back over a gap, and alone it must not pass for a
// first run that compared up to its start.
const windowStartSQL = `SELECT id, started_at FROM (
		SELECT id, started_at, min(coalesce(window_since, '')) OVER (
			ORDER BY started_at DESC, id DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
		FROM (SELECT id, started_at, window_since FROM reconcile_runs
			WHERE resource = ? AND status = 'ok' AND dry_run = 0
				AND (window_since IS NULL OR window_since <= started_at)
			ORDER BY started_at DESC, id DESC LIMIT ?))
	WHERE reach IS NULL OR reach > started_at ORDER BY started_at, id LIMIT 1`

// PruneReconcileRuns deletes the reconcile runs started before before,
// except, for each resource, its last successful, non-dry run and the run
// the default window of its next reconcile starts from (LastReconcile),
// and returns how many it deleted.
func (db *DB) PruneReconcileRuns(ctx context.Context, before time.Time) (int64, error) {
	keep := make([]any, 0, len(backstop.Resources)+1)
	keep = append(keep, backstop.CanonicalTime(before))
	for _, r := range backstop.Resources {
		id, _, ok, err := db.windowStart(ctx, r)
		if err != nil {
			return 0, fmt.Errorf("prune reconcile runs: %w", err)
		}
		if ok {
			keep = append(keep, id)
		}
	}
	q := `DELETE FROM reconcile_runs WHERE started_at < ? AND id NOT IN (
		SELECT (SELECT k.id FROM reconcile_runs AS k
			WHERE k.resource = r.resource AND k.status = 'ok' AND k.dry_run = 0
			ORDER BY k.started_at DESC, k.id DESC LIMIT 1)
		FROM (SELECT DISTINCT resource FROM reconcile_runs) AS r)`
	if len(keep) > 1 {
		q += ` AND id NOT IN (` + placeholders(len(keep)-1) + `)`
	}
	n, err := db.execCount(ctx, q, keep...)
	if err != nil {
		return n, fmt.Errorf("prune reconcile runs: %w", err)
	}
	return n, nil
}

// LastReconcile returns where the default window of r's next reconcile
// starts from, before its lookback: the start of the last successful,
// non-dry run of r whose window joined those before it, or ok=false when
// there has been none (none that compared anything: a run whose window
// began after its own start does not count). Each run compares the
// objects updated between its window's start and its own start; a run
// whose window started after the previous run's start (a narrower
// --since, or one in the future) left the time between compared by no run
// and does not count: the earliest start that no later run's window
// reached back to is returned, so that the next default window covers the
// gap (see windowRuns).
func (db *DB) LastReconcile(ctx context.Context, r backstop.Resource) (startedAt time.Time, ok bool, err error) {
	_, startedAt, ok, err = db.windowStart(ctx, r)
	return startedAt, ok, err
}

// windowStart returns the id and start of the run selected by
// windowStartSQL for r, or ok=false when r has no successful, non-dry run.
func (db *DB) windowStart(ctx context.Context, r backstop.Resource) (id int64, startedAt time.Time, ok bool, err error) {
	var row struct {
		ID        int64  `db:"id"`
		StartedAt string `db:"started_at"`
	}
	err = db.r.GetContext(ctx, &row, windowStartSQL, string(r), windowRuns)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, time.Time{}, false, nil
	}
	if err != nil {
		return 0, time.Time{}, false, fmt.Errorf("last reconcile of %s: %w", r, err)
	}
	t, err := backstop.ParseTime(row.StartedAt)
	if err != nil {
		return 0, time.Time{}, false, fmt.Errorf("last reconcile of %s: started_at: %w", r, err)
	}
	return row.ID, t, true, nil
}

// ReconcileRun is one stored reconcile run.
type ReconcileRun struct {
	ID int64
	// ReconcileReport holds the run's counts (so far, as of its last
	// page, while it runs or when it was abandoned); its Err is nil and
	// the error's text is in Error.
	backstop.ReconcileReport
	// FinishedAt is zero while the run is still going (or was killed).
	FinishedAt time.Time
	// Status is "running", "ok", "failed", "interrupted" (cancelled) or
	// "abandoned" (its process died; see AbandonStaleReconciles).
	Status string
	Error  string
}

// reconcileRunRow is one row of reconcile_runs as read back.
type reconcileRunRow struct {
	ID          int64          `db:"id"`
	Resource    string         `db:"resource"`
	StartedAt   string         `db:"started_at"`
	FinishedAt  sql.NullString `db:"finished_at"`
	WindowSince sql.NullString `db:"window_since"`
	Full        bool           `db:"full"`
	DryRun      bool           `db:"dry_run"`
	Pages       int            `db:"pages"`
	Scanned     int            `db:"scanned"`
	Missing     int            `db:"missing"`
	Behind      int            `db:"behind"`
	Reemitted   int            `db:"reemitted"`
	Suppressed  int            `db:"suppressed"`
	Orphans     int            `db:"orphans"`
	Requests    int            `db:"requests"`
	RateLimited int            `db:"rate_limited"`
	DurationMS  int64          `db:"duration_ms"`
	Status      string         `db:"status"`
	Error       sql.NullString `db:"error"`
}

func (row reconcileRunRow) run() (ReconcileRun, error) {
	run := ReconcileRun{
		ID: row.ID,
		ReconcileReport: backstop.ReconcileReport{
			Resource: backstop.Resource(row.Resource), Full: row.Full, DryRun: row.DryRun,
			Pages: row.Pages, Scanned: row.Scanned, Missing: row.Missing, Behind: row.Behind,
			Reemitted: row.Reemitted, Suppressed: row.Suppressed, Orphans: row.Orphans,
			Cost:     backstop.Cost{Requests: row.Requests, RateLimited: row.RateLimited},
			Duration: time.Duration(row.DurationMS) * time.Millisecond,
		},
		Status: row.Status,
		Error:  row.Error.String,
	}
	var err error
	if run.StartedAt, err = backstop.ParseTime(row.StartedAt); err != nil {
		return run, fmt.Errorf("started_at: %w", err)
	}
	if run.Since, err = parseNullTime(row.WindowSince); err != nil {
		return run, fmt.Errorf("window_since: %w", err)
	}
	if run.FinishedAt, err = parseNullTime(row.FinishedAt); err != nil {
		return run, fmt.Errorf("finished_at: %w", err)
	}
	return run, nil
}

// ReconcileRuns returns the last limit reconcile runs of every resource,
// newest first; limit <= 0 means all.
func (db *DB) ReconcileRuns(ctx context.Context, limit int) ([]ReconcileRun, error) {
	if limit <= 0 {
		limit = -1
	}
	var rows []reconcileRunRow
	if err := db.r.SelectContext(ctx, &rows, `SELECT id, resource, started_at, finished_at, window_since,
		full, dry_run, pages, scanned, missing, behind, reemitted, suppressed, orphans, requests,
		rate_limited, duration_ms, status, error FROM reconcile_runs ORDER BY started_at DESC, id DESC LIMIT ?`,
		limit); err != nil {
		return nil, fmt.Errorf("list reconcile runs: %w", err)
	}
	out := make([]ReconcileRun, len(rows))
	for i, row := range rows {
		run, err := row.run()
		if err != nil {
			return nil, fmt.Errorf("list reconcile runs: run %d: %w", row.ID, err)
		}
		out[i] = run
	}
	return out, nil
}
