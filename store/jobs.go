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

// JobRun is one stored run of a scheduled job.
type JobRun struct {
	ID         int64
	Job        string
	Kind       string
	StartedAt  time.Time
	FinishedAt time.Time
	// Status is "ok", "failed", "interrupted" (cancelled before it
	// finished) or "skipped".
	Status string
	Counts backstop.JobCounts
	// Error is the failed run's error, empty otherwise.
	Error string
}

// jobRunColumns are the columns of job_runs in the order jobRunRow lists them.
const jobRunColumns = `id, job, kind, started_at, finished_at, status, pages, objects, new, updated,
	missing, behind, reemitted, suppressed, pruned, requests, rate_limited, error`

// jobRunRow is one row of job_runs.
type jobRunRow struct {
	ID          int64          `db:"id"`
	Job         string         `db:"job"`
	Kind        string         `db:"kind"`
	StartedAt   string         `db:"started_at"`
	FinishedAt  string         `db:"finished_at"`
	Status      string         `db:"status"`
	Pages       int            `db:"pages"`
	Objects     int            `db:"objects"`
	New         int            `db:"new"`
	Updated     int            `db:"updated"`
	Missing     int            `db:"missing"`
	Behind      int            `db:"behind"`
	Reemitted   int            `db:"reemitted"`
	Suppressed  int            `db:"suppressed"`
	Pruned      int64          `db:"pruned"`
	Requests    int            `db:"requests"`
	RateLimited int            `db:"rate_limited"`
	Error       sql.NullString `db:"error"`
}

func (row jobRunRow) jobRun() (JobRun, error) {
	run := JobRun{
		ID: row.ID, Job: row.Job, Kind: row.Kind, Status: row.Status, Error: row.Error.String,
		Counts: backstop.JobCounts{
			Pages: row.Pages, Objects: row.Objects, New: row.New, Updated: row.Updated,
			Missing: row.Missing, Behind: row.Behind, Reemitted: row.Reemitted,
			Suppressed: row.Suppressed, Pruned: row.Pruned, Requests: row.Requests,
			RateLimited: row.RateLimited,
		},
	}
	var err error
	if run.StartedAt, err = backstop.ParseTime(row.StartedAt); err != nil {
		return run, fmt.Errorf("job run %d: started_at: %w", row.ID, err)
	}
	if run.FinishedAt, err = backstop.ParseTime(row.FinishedAt); err != nil {
		return run, fmt.Errorf("job run %d: finished_at: %w", row.ID, err)
	}
	return run, nil
}

// SaveJobRun stores a finished run and returns its id. It fails on an empty
// job name or a status other than "ok", "failed", "interrupted" and
// "skipped". A zero StartedAt or FinishedAt is stored as now.
func (db *DB) SaveJobRun(ctx context.Context, run JobRun) (int64, error) {
	if run.Job == "" {
		return 0, errors.New("save job run: empty job name")
	}
	switch run.Status {
	case "ok", "failed", "interrupted", "skipped":
	default:
		return 0, fmt.Errorf("save job run %s: unknown status %q", run.Job, run.Status)
	}
	now := db.now()
	if run.StartedAt.IsZero() {
		run.StartedAt = now
	}
	if run.FinishedAt.IsZero() {
		run.FinishedAt = now
	}
	c := run.Counts
	res, err := db.w.ExecContext(ctx, `INSERT INTO job_runs (job, kind, started_at, finished_at, status,
		pages, objects, new, updated, missing, behind, reemitted, suppressed, pruned, requests, rate_limited, error)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		run.Job, run.Kind, backstop.CanonicalTime(run.StartedAt), backstop.CanonicalTime(run.FinishedAt), run.Status,
		c.Pages, c.Objects, c.New, c.Updated, c.Missing, c.Behind, c.Reemitted, c.Suppressed, c.Pruned,
		c.Requests, c.RateLimited, nullString(run.Error))
	if err != nil {
		return 0, fmt.Errorf("save job run %s: %w", run.Job, err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return 0, fmt.Errorf("save job run %s: %w", run.Job, err)
	}
	return id, nil
}

// JobRuns returns the stored runs of job, the newest first, at most limit
// of them (all when limit <= 0).
func (db *DB) JobRuns(ctx context.Context, job string, limit int) ([]JobRun, error) {
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	var rows []jobRunRow
	if err := db.r.SelectContext(ctx, &rows, `SELECT `+jobRunColumns+` FROM job_runs
		WHERE job = ? ORDER BY started_at DESC, id DESC LIMIT ?`, job, limit); err != nil {
		return nil, fmt.Errorf("list runs of job %s: %w", job, err)
	}
	out := make([]JobRun, len(rows))
	for i, row := range rows {
		run, err := row.jobRun()
		if err != nil {
			return nil, fmt.Errorf("list runs of job %s: %w", job, err)
		}
		out[i] = run
	}
	return out, nil
}

// LastJobRun returns the newest stored run of job that did run (any status
// but skipped), or, when every stored run was skipped, the newest skipped
// one; ok=false when none is stored. A job longer than its interval is
// skipped at every tick while it runs: the newest row would hide the
// outcome of the run that matters.
func (db *DB) LastJobRun(ctx context.Context, job string) (JobRun, bool, error) {
	// Two walks of job_runs_job backwards, rather than one sort of every
	// kept run of the job: the newest that ran, else the newest at all.
	var rows []jobRunRow
	for _, q := range []string{
		`SELECT ` + jobRunColumns + ` FROM job_runs WHERE job = ? AND status <> 'skipped' ORDER BY started_at DESC, id DESC LIMIT 1`,
		`SELECT ` + jobRunColumns + ` FROM job_runs WHERE job = ? ORDER BY started_at DESC, id DESC LIMIT 1`,
	} {
		if err := db.r.SelectContext(ctx, &rows, q, job); err != nil {
			return JobRun{}, false, fmt.Errorf("last run of job %s: %w", job, err)
		}
		if len(rows) > 0 {
			break
		}
	}
	if len(rows) == 0 {
		return JobRun{}, false, nil
	}
	run, err := rows[0].jobRun()
	if err != nil {
		return JobRun{}, false, fmt.Errorf("last run of job %s: %w", job, err)
	}
	return run, true, nil
}

// LastJobStart returns when the newest run of job that ran to its end
// (ok or failed) started; ok=false when none is stored. Skipped runs did
// not run and interrupted ones did not finish, so neither counts: the
// scheduler starts an interval job's first run from this time.
func (db *DB) LastJobStart(ctx context.Context, job string) (time.Time, bool, error) {
	var started []string
	if err := db.r.SelectContext(ctx, &started, `SELECT started_at FROM job_runs
		WHERE job = ? AND (status = 'ok' OR status = 'failed') ORDER BY started_at DESC, id DESC LIMIT 1`, job); err != nil {
		return time.Time{}, false, fmt.Errorf("last start of job %s: %w", job, err)
	}
	if len(started) == 0 {
		return time.Time{}, false, nil
	}
	t, err := backstop.ParseTime(started[0])
	if err != nil {
		return time.Time{}, false, fmt.Errorf("last start of job %s: %w", job, err)
	}
	return t, true, nil
}

// PruneJobRuns deletes the job runs started before before and returns how
// many it deleted.
func (db *DB) PruneJobRuns(ctx context.Context, before time.Time) (int64, error) {
	res, err := db.w.ExecContext(ctx, `DELETE FROM job_runs WHERE started_at < ?`, backstop.CanonicalTime(before))
	if err != nil {
		return 0, fmt.Errorf("prune job runs: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("prune job runs: %w", err)
	}
	return n, nil
}

// EmitPage is the emit path of a feed page read by sync or backfill: it
// processes events exactly as Emit does (dedup insert, mirror upsert when
// newer, one outbox row per matching route) and saves cur, all in one
// transaction, so the saved cursor is never ahead of the events emitted
// for the objects before it, and a crash between pages re-reads (and
// re-emits, as duplicates) at most the page in flight. As in ApplyPage, the
// cursor never moves back: a cur before the saved position is not saved.
//
// Events are the caller's choice (sync emits the objects of the page that
// are new or newer than the mirror); objects of the page that need no event
// need not be passed, since the mirror already holds their version. Results
// are in the order of events. On error nothing is committed, neither the
// events nor the cursor. It fails as Emit does, and on a cursor of an
// unknown resource or kind.
func (db *DB) EmitPage(ctx context.Context, events []backstop.Event, routes []backstop.Route, cur backstop.Cursor) ([]backstop.EmitResult, error) {
	res, err := db.emitPage(ctx, events, routes, cur)
	if err != nil {
		return nil, fmt.Errorf("emit %s page: %w", cur.Resource, err)
	}
	return res, nil
}

func (db *DB) emitPage(ctx context.Context, events []backstop.Event, routes []backstop.Route, cur backstop.Cursor) ([]backstop.EmitResult, error) {
	if err := checkCursor(cur); err != nil {
		return nil, err
	}
	if err := checkRoutes(routes); err != nil {
		return nil, err
	}
	now := db.now()
	stamp := backstop.CanonicalTime(now)

	tx, err := db.w.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()

	// As in Emit: statements run without ctx's cancellation; ctx is checked
	// between events and by the commit.
	sctx := context.WithoutCancel(ctx)
	out, err := db.emitInTx(ctx, sctx, tx, now, stamp, events, routes)
	if err != nil {
		return nil, err
	}
	row := newCursorRow(cur, now)
	// saveCursor never moves the cursor back (saveCursorSQL).
	if _, err := tx.StmtxContext(sctx, db.saveCursor).ExecContext(sctx,
		row.Resource, row.Kind, row.Value, row.PosUpdatedAt, row.PosID, row.Done, row.UpdatedAt); err != nil {
		return nil, fmt.Errorf("save cursor: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("commit %d events and cursor: %w", len(events), err)
	}
	return out, nil
}

// emitInTx runs the emit path's per-event steps (emitTx, shared with Emit)
// for events inside tx.
func (db *DB) emitInTx(ctx, sctx context.Context, tx *sqlx.Tx, now time.Time, stamp string, events []backstop.Event, routes []backstop.Route) ([]backstop.EmitResult, error) {
	et := &emitTx{
		insert: tx.StmtxContext(sctx, db.insertEvent),
		mirror: db.mirrorWriter(tx, now),
		queue:  db.outboxQueue(tx, stamp),
		now:    now,
		stamp:  stamp,
	}
	out := make([]backstop.EmitResult, len(events))
	for i, ev := range events {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r, err := et.emit(sctx, ev, routes)
		if err != nil {
			return nil, fmt.Errorf("event %d of %d (%s): %w", i+1, len(events), ev.ID, err)
		}
		out[i] = r
	}
	return out, nil
}
