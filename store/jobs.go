package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	stdsync "sync"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/backstop-sync/backstop"
)

// JobRun is one stored run of a scheduled job.
type JobRun struct {
	ID        int64
	Job       string
	Kind      string
	StartedAt time.Time
	// FinishedAt is when the run ended; for a run still running, its last
	// heartbeat (it went on at least until then).
	FinishedAt time.Time
	// Status is "running" (stored at its start, StartJobRun), "ok",
	// "failed", "interrupted" (cancelled before it finished), "skipped"
	// or "abandoned" (left running by a process that died, see
	// AbandonStaleJobRuns).
	Status string
	Counts backstop.JobCounts
	// Error is the failed or abandoned run's error, empty otherwise.
	Error string
	// HeartbeatAt is when the run last said it was going on: its start,
	// then every heartbeat (JobRunHeartbeat), and its end.
	HeartbeatAt time.Time
	// Locked, given to StartJobRun (it is not stored), says the run holds
	// its job's lock (in Redis), so no other run of the job is going on:
	// StartJobRun then closes every other run of it left "running",
	// however recent its last heartbeat, rather than only stale ones.
	Locked bool
	// Output is what the run made that its counts do not tell (a backup
	// job's file); empty otherwise.
	Output string
	// Owner is the process that started a run stored by StartJobRun,
	// which stores it (whatever is given): "host/pid/start/space" (see
	// processOwner). It is empty for a run stored in one go (SaveJobRun)
	// and for runs started by older binaries.
	Owner string
}

// jobRunColumns are the columns of job_runs in the order jobRunRow lists them.
const jobRunColumns = `id, job, kind, started_at, finished_at, status, pages, objects, new, updated,
	missing, behind, reemitted, suppressed, pruned, requests, rate_limited, error, heartbeat_at, output, owner, orphans`

// jobRunRow is one row of job_runs.
type jobRunRow struct {
	ID          int64          `db:"id"`
	Job         string         `db:"job"`
	Kind        string         `db:"kind"`
	StartedAt   string         `db:"started_at"`
	FinishedAt  sql.NullString `db:"finished_at"`
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
	HeartbeatAt string         `db:"heartbeat_at"`
	Output      sql.NullString `db:"output"`
	Owner       sql.NullString `db:"owner"`
	Orphans     sql.NullInt64  `db:"orphans"`
}

func (row jobRunRow) jobRun() (JobRun, error) {
	run := JobRun{
		ID: row.ID, Job: row.Job, Kind: row.Kind, Status: row.Status, Error: row.Error.String, Output: row.Output.String,
		Owner: row.Owner.String,
		Counts: backstop.JobCounts{
			Pages: row.Pages, Objects: row.Objects, New: row.New, Updated: row.Updated,
			Missing: row.Missing, Behind: row.Behind, Reemitted: row.Reemitted,
			Suppressed: row.Suppressed, Pruned: row.Pruned, Requests: row.Requests,
			RateLimited: row.RateLimited,
		},
	}
	if row.Orphans.Valid {
		n := int(row.Orphans.Int64)
		run.Counts.Orphans = &n
	}
	var err error
	if run.StartedAt, err = backstop.ParseTime(row.StartedAt); err != nil {
		return run, fmt.Errorf("job run %d: started_at: %w", row.ID, err)
	}
	if run.FinishedAt, err = parseNullTime(row.FinishedAt); err != nil {
		return run, fmt.Errorf("job run %d: finished_at: %w", row.ID, err)
	}
	// Written by SQLite's default for a run stored by an older binary:
	// strftime's milliseconds, which ParseTime reads too.
	if run.HeartbeatAt, err = backstop.ParseTime(row.HeartbeatAt); err != nil {
		return run, fmt.Errorf("job run %d: heartbeat_at: %w", row.ID, err)
	}
	if run.Status == "running" {
		run.FinishedAt = run.HeartbeatAt
	}
	return run, nil
}

// SaveJobRun stores a run that ended (or was skipped) in one go and returns
// its id; a run that goes on for a while is stored by StartJobRun and
// FinishJobRun instead. It fails on an empty job name or a status other
// than "ok", "failed", "interrupted" and "skipped". A zero StartedAt or
// FinishedAt is stored as now.
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
		pages, objects, new, updated, missing, behind, reemitted, suppressed, pruned, requests, rate_limited, error,
		heartbeat_at, output, orphans)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		run.Job, run.Kind, backstop.CanonicalTime(run.StartedAt), backstop.CanonicalTime(run.FinishedAt), run.Status,
		c.Pages, c.Objects, c.New, c.Updated, c.Missing, c.Behind, c.Reemitted, c.Suppressed, c.Pruned,
		c.Requests, c.RateLimited, nullString(run.Error), backstop.CanonicalTime(run.FinishedAt), nullString(run.Output),
		nullCount(c.Orphans))
	if err != nil {
		return 0, fmt.Errorf("save job run %s: %w", run.Job, err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return 0, fmt.Errorf("save job run %s: %w", run.Job, err)
	}
	return id, nil
}

// JobRunStaleAfter is how long a job run may go without a heartbeat before
// a "running" row is taken for one whose process died (SIGKILL, a crash, a
// power loss) and closed as "abandoned". A live run beats every minute
// (sync.DefaultJobHeartbeat), whatever it is waiting for, so an hour
// without one is far beyond any live run, also one in another process
// sharing this store. It is ReconcileStaleAfter.
const JobRunStaleAfter = ReconcileStaleAfter

// JobRunLiveWithin is how recent the last heartbeat of a running run of a
// job must be for StartJobRun to take it for one going on in another
// process, and refuse a new run of the job beside it: three heartbeats
// (sync.DefaultJobHeartbeat, a minute). A run whose process was killed
// holds its job up that long at most (not at all when that process ran on
// this host, see StartJobRun); it is closed as abandoned later
// (JobRunStaleAfter).
const JobRunLiveWithin = 3 * time.Minute

// JobRunningError is StartJobRun's refusal of a run while another run of
// the job goes on (it wraps backstop.ErrJobRunning): the run that does,
// when it started and when it last beat.
type JobRunningError struct {
	Job                    string
	ID                     int64
	StartedAt, HeartbeatAt time.Time
}

func (e *JobRunningError) Error() string {
	return fmt.Sprintf("%v: run %d, started %s, last heartbeat %s (if its process is gone, the job runs again once that is %s old)",
		backstop.ErrJobRunning, e.ID, e.StartedAt.UTC().Format(time.RFC3339), e.HeartbeatAt.UTC().Format(time.RFC3339), JobRunLiveWithin)
}

// Unwrap makes errors.Is(err, backstop.ErrJobRunning) true.
func (e *JobRunningError) Unwrap() error { return backstop.ErrJobRunning }

// HeldUntil returns when the run going on stops holding its job up should
// it not beat again (its process killed on another host): from then on
// StartJobRun starts a new run of the job. The scheduler tries a skipped
// run again then.
func (e *JobRunningError) HeldUntil() time.Time { return e.HeartbeatAt.Add(JobRunLiveWithin) }

// abandonJobRunsSQL closes the running job runs whose last heartbeat is
// before the second parameter, of the job given as the third (all when it
// is empty); the first is now.
const abandonJobRunsSQL = `UPDATE job_runs SET status = 'abandoned', finished_at = ?1,
		error = 'abandoned: no heartbeat since ' || heartbeat_at || ' (its process was killed or crashed)'
	WHERE status = 'running' AND heartbeat_at < ?2 AND (?3 = '' OR job = ?3)`

// abandonUnlockedJobRunsSQL closes the running runs of the job given as
// the second parameter when a new run of it holds the job's lock: its
// lock was free, so their process is gone (or has lost the lock and is
// stopping, and its finish still takes its real result).
const abandonUnlockedJobRunsSQL = `UPDATE job_runs SET status = 'abandoned', finished_at = ?1,
		error = 'abandoned: the job''s lock was free when the next run took it (its process was killed or crashed); last heartbeat ' || heartbeat_at
	WHERE status = 'running' AND job = ?2`

// abandonStaleJobRuns closes the stale running runs of job (of every job
// when it is empty) through ex and returns how many it closed.
func (db *DB) abandonStaleJobRuns(ctx context.Context, ex sqlx.ExecerContext, job string) (int64, error) {
	now := db.now()
	res, err := ex.ExecContext(ctx, abandonJobRunsSQL, backstop.CanonicalTime(now),
		backstop.CanonicalTime(now.Add(-JobRunStaleAfter)), job)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// AbandonStaleJobRuns closes as "abandoned" every "running" job run whose
// last heartbeat is more than JobRunStaleAfter old: its process died
// without finishing it. It returns how many runs it closed. Maintenance
// runs it; StartJobRun does the same for its job.
func (db *DB) AbandonStaleJobRuns(ctx context.Context) (int64, error) {
	n, err := db.abandonStaleJobRuns(ctx, db.w, "")
	if err != nil {
		return 0, fmt.Errorf("abandon stale job runs: %w", err)
	}
	return n, nil
}

// StartJobRun records the start of run (Job, Kind, StartedAt) with status
// "running", its first heartbeat and this process as its owner
// (JobRun.Owner), and returns its id, which JobRunHeartbeat and
// FinishJobRun take. In the same transaction it closes the stale running
// runs of the job as AbandonStaleJobRuns does, so a run killed with
// SIGKILL is closed by the next run of its job; a run.Locked closes every
// running run of the job, at once. A run not Locked is refused with a
// *JobRunningError while another run of the job has beaten within
// JobRunLiveWithin: without a lock in Redis, this is what keeps two
// processes on one store (serve's schedule and backstop run from cron, or
// two cron runs) from running a job twice at once. A running run whose
// owner ran on this host and is gone (a serve killed and restarted at
// once) neither refuses the new run nor waits for that: it is closed as
// abandoned. A zero StartedAt is stored as now. It fails on an empty job
// name.
func (db *DB) StartJobRun(ctx context.Context, run JobRun) (int64, error) {
	id, err := db.startJobRun(ctx, run)
	var running *JobRunningError
	if errors.As(err, &running) {
		return 0, err
	}
	if err != nil {
		return 0, fmt.Errorf("start job run %s: %w", run.Job, err)
	}
	return id, nil
}

// abandonGoneJobRunSQL closes the running run ?2, whose process is gone
// (ownerGone), saying which process that was (?3).
const abandonGoneJobRunSQL = `UPDATE job_runs SET status = 'abandoned', finished_at = ?1,
		error = 'abandoned: its process (' || ?3 || ') is gone; last heartbeat ' || heartbeat_at
	WHERE id = ?2 AND status = 'running'`

func (db *DB) startJobRun(ctx context.Context, run JobRun) (int64, error) {
	if run.Job == "" {
		return 0, errors.New("empty job name")
	}
	now := db.now()
	if run.StartedAt.IsZero() {
		run.StartedAt = now
	}
	tx, err := db.w.BeginTxx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback()
	if run.Locked {
		if _, err := tx.ExecContext(ctx, abandonUnlockedJobRunsSQL, backstop.CanonicalTime(now), run.Job); err != nil {
			return 0, fmt.Errorf("abandon runs left running: %w", err)
		}
	} else {
		if _, err := db.abandonStaleJobRuns(ctx, tx, run.Job); err != nil {
			return 0, fmt.Errorf("abandon stale runs: %w", err)
		}
		refused, err := db.checkRunningJobRuns(ctx, tx, run.Job, now)
		if err != nil {
			return 0, err
		}
		if refused != nil {
			// The runs found gone are closed all the same.
			if err := tx.Commit(); err != nil {
				return 0, fmt.Errorf("commit: %w", err)
			}
			return 0, refused
		}
	}
	// finished_at holds the last heartbeat while the run goes on (see
	// migration 0012): never NULL, for binaries that read it as a string.
	res, err := tx.ExecContext(ctx, `INSERT INTO job_runs (job, kind, started_at, finished_at, status, heartbeat_at, owner)
		VALUES (?1, ?2, ?3, ?4, 'running', ?4, ?5)`, run.Job, run.Kind, backstop.CanonicalTime(run.StartedAt),
		backstop.CanonicalTime(now), nullString(processOwner().String()))
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

// checkRunningJobRuns closes, through tx, the running runs of job whose
// process is gone (ownerGone), and returns the refusal of a new run when
// another one has beaten within JobRunLiveWithin of now (nil when none).
func (db *DB) checkRunningJobRuns(ctx context.Context, tx *sqlx.Tx, job string, now time.Time) (*JobRunningError, error) {
	var rows []jobRunRow
	if err := tx.SelectContext(ctx, &rows, `SELECT `+jobRunColumns+` FROM job_runs
		WHERE job = ? AND status = 'running' ORDER BY id`, job); err != nil {
		return nil, fmt.Errorf("read runs going on: %w", err)
	}
	var refused *JobRunningError
	for _, row := range rows {
		other, err := row.jobRun()
		if err != nil {
			return nil, err
		}
		if owner, gone := ownerGone(other.Owner); gone {
			if _, err := tx.ExecContext(ctx, abandonGoneJobRunSQL, backstop.CanonicalTime(now), other.ID,
				owner.process()); err != nil {
				return nil, fmt.Errorf("abandon run %d: %w", other.ID, err)
			}
			continue
		}
		if refused == nil && !other.HeartbeatAt.Before(now.Add(-JobRunLiveWithin)) {
			refused = &JobRunningError{Job: job, ID: other.ID, StartedAt: other.StartedAt, HeartbeatAt: other.HeartbeatAt}
		}
	}
	return refused, nil
}

// runOwner is the process that started a job run (JobRun.Owner).
type runOwner struct {
	host string
	pid  int
	// start is when the process started, in clock ticks after the boot
	// (field 22 of /proc/PID/stat): a pid used again later by another
	// process is not taken for it. Empty when unknown (no /proc).
	start string
	// space is the boot (/proc/sys/kernel/random/boot_id), the pid
	// namespace (/proc/self/ns/pid) and the time namespace (where the
	// kernel has them) the pid and start belong to: two containers on
	// one host may share a host name but not their pids, a start time
	// means nothing after a reboot, and /proc gives start times in its
	// reader's time namespace. Empty when unknown.
	space string
}

// String returns the owner as stored: "host/pid/start/space".
func (o runOwner) String() string {
	return o.host + "/" + strconv.Itoa(o.pid) + "/" + o.start + "/" + o.space
}

// process names the owner's process as messages do: "pid 4242 on host vm".
func (o runOwner) process() string { return fmt.Sprintf("pid %d on host %s", o.pid, o.host) }

// parseOwner reads a stored owner; ok=false when s is not one (empty, for
// a run of an older binary).
func parseOwner(s string) (o runOwner, ok bool) {
	// Host names hold no '/', and neither do the other parts.
	parts := strings.Split(s, "/")
	if len(parts) != 4 {
		return o, false
	}
	pid, err := strconv.Atoi(parts[1])
	if err != nil || pid <= 0 {
		return o, false
	}
	return runOwner{host: parts[0], pid: pid, start: parts[2], space: parts[3]}, true
}

// processOwner returns this process as the owner of the runs it starts.
var processOwner = stdsync.OnceValue(func() runOwner {
	host, _ := os.Hostname()
	o := runOwner{host: host, pid: os.Getpid()}
	// /proc must be this pid namespace's own (a process unshared into a
	// new one without mounting its /proc sees another's, where its pid
	// names some other process): otherwise the owner has no start, and
	// its runs are never taken for gone.
	if self, err := os.Readlink("/proc/self"); err != nil || self != strconv.Itoa(o.pid) {
		return o
	}
	start, err := procStart(o.pid)
	if err != nil {
		return o
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return o
	}
	// "pid:[4026531836]": the inode number tells namespaces apart. The
	// time namespace is part of it too: the start times /proc shows are
	// of the reader's time namespace (CRIU-restored containers, unshare
	// -T), so that two processes in different ones would see a live
	// owner's start as another's.
	space := strings.TrimSpace(string(boot))
	for _, kind := range []string{"pid", "time"} {
		ns, err := os.Readlink("/proc/self/ns/" + kind)
		if errors.Is(err, os.ErrNotExist) && kind == "time" {
			continue // a kernel before time namespaces (5.6): one for all
		}
		if err != nil {
			return o
		}
		space += ":" + strings.TrimSuffix(strings.TrimPrefix(ns, kind+":["), "]")
	}
	o.start, o.space = start, space
	return o
})

// procStart returns when process pid started, in clock ticks after the
// boot: field 22 of /proc/PID/stat.
func procStart(pid int) (string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", err
	}
	// The second field, the command's name in parentheses, may hold
	// spaces and parentheses itself: the fields after it start after the
	// last ')', with the third.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 22-2 {
		return "", fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields)+2)
	}
	return fields[22-3], nil
}

// ownerGone reports whether the process that owns a run (its stored
// Owner) is known to be gone: it ran on this host, in this boot and pid
// namespace, and its pid is now free or another process's (another start
// time). A run of another host, of an older binary (no owner), or of a
// process this one cannot see, is never taken for gone: its heartbeat
// tells (JobRunLiveWithin).
func ownerGone(stored string) (runOwner, bool) {
	o, ok := parseOwner(stored)
	me := processOwner()
	if !ok || me.start == "" || me.space == "" || o.start == "" || o.host != me.host || o.space != me.space {
		return o, false
	}
	if o.pid == me.pid {
		return o, o.start != me.start
	}
	start, err := procStart(o.pid)
	switch {
	case err == nil:
		return o, start != o.start
	case !errors.Is(err, os.ErrNotExist):
		return o, false
	}
	// No /proc/PID: the pid is free, unless /proc hides other users'
	// processes (mounted with hidepid): ask the kernel.
	p, err := os.FindProcess(o.pid)
	if err != nil {
		return o, false
	}
	defer p.Release()
	return o, errors.Is(p.Signal(syscall.Signal(0)), os.ErrProcessDone)
}

// OwnerGone reports whether the process that started a run (its Owner) is
// known to be gone, as the next start of the job would find it
// (StartJobRun closes such a run as abandoned), and names it ("pid 4242 on
// host vm"). A run of another host, or whose process this one cannot
// see, is never taken for gone.
func OwnerGone(owner string) (process string, gone bool) {
	o, gone := ownerGone(owner)
	if !gone {
		return "", false
	}
	return o.process(), true
}

// JobRunHeartbeat records that run id is still going, so that it is not
// taken for abandoned (JobRunStaleAfter). A run no longer running (closed
// as abandoned while it went on) is left alone and an error says so; it
// returns ErrNotFound when there is no run id.
func (db *DB) JobRunHeartbeat(ctx context.Context, id int64) error {
	return db.beat(ctx, id, `UPDATE job_runs SET heartbeat_at = ?1, finished_at = ?1 WHERE id = ?2 AND status = 'running'`)
}

// JobRunProgress is JobRunHeartbeat that also stores the run's counts so
// far, so that a run killed midway is closed as abandoned with what it
// had done, and backstop jobs shows it while it goes on.
func (db *DB) JobRunProgress(ctx context.Context, id int64, c backstop.JobCounts) error {
	return db.beat(ctx, id, `UPDATE job_runs SET heartbeat_at = ?1, finished_at = ?1, pages = ?3, objects = ?4,
		new = ?5, updated = ?6, missing = ?7, behind = ?8, reemitted = ?9, suppressed = ?10, pruned = ?11,
		requests = ?12, rate_limited = ?13
		WHERE id = ?2 AND status = 'running'`,
		c.Pages, c.Objects, c.New, c.Updated, c.Missing, c.Behind, c.Reemitted, c.Suppressed, c.Pruned,
		c.Requests, c.RateLimited)
}

// beat runs a heartbeat update of run id (parameters ?1 now, ?2 id, then
// args) and says why when the run is not running.
func (db *DB) beat(ctx context.Context, id int64, update string, args ...any) error {
	res, err := db.w.ExecContext(ctx, update, append([]any{backstop.CanonicalTime(db.now()), id}, args...)...)
	if err != nil {
		return fmt.Errorf("job run %d heartbeat: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("job run %d heartbeat: %w", id, err)
	} else if n > 0 {
		return nil
	}
	var status []string
	if err := db.r.SelectContext(ctx, &status, `SELECT status FROM job_runs WHERE id = ?`, id); err != nil {
		return fmt.Errorf("job run %d heartbeat: %w", id, err)
	}
	if len(status) == 0 {
		return fmt.Errorf("job run %d heartbeat: %w", id, backstop.ErrNotFound)
	}
	return fmt.Errorf("job run %d heartbeat: the run was closed as %s while it went on", id, status[0])
}

// FinishJobRun stores the end of the run started by StartJobRun (run.ID):
// its status ("ok", "failed" or "interrupted"), counts and error, with
// FinishedAt (zero: now). A run closed as abandoned while it went on (no
// heartbeat for JobRunStaleAfter) takes its real result. It fails with
// ErrNotFound when no such run is running or abandoned.
func (db *DB) FinishJobRun(ctx context.Context, run JobRun) error {
	switch run.Status {
	case "ok", "failed", "interrupted":
	default:
		return fmt.Errorf("finish job run %d (%s): unknown status %q", run.ID, run.Job, run.Status)
	}
	now := db.now()
	if run.FinishedAt.IsZero() {
		run.FinishedAt = now
	}
	c := run.Counts
	res, err := db.w.ExecContext(ctx, `UPDATE job_runs SET finished_at = ?, status = ?, pages = ?, objects = ?,
		new = ?, updated = ?, missing = ?, behind = ?, reemitted = ?, suppressed = ?, pruned = ?, requests = ?,
		rate_limited = ?, error = ?, heartbeat_at = ?, output = ?, orphans = ?
		WHERE id = ? AND status IN ('running', 'abandoned')`,
		backstop.CanonicalTime(run.FinishedAt), run.Status, c.Pages, c.Objects, c.New, c.Updated, c.Missing,
		c.Behind, c.Reemitted, c.Suppressed, c.Pruned, c.Requests, c.RateLimited, nullString(run.Error),
		backstop.CanonicalTime(now), nullString(run.Output), nullCount(c.Orphans), run.ID)
	if err != nil {
		return fmt.Errorf("finish job run %d (%s): %w", run.ID, run.Job, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("finish job run %d (%s): %w", run.ID, run.Job, err)
	} else if n == 0 {
		return fmt.Errorf("finish job run %d (%s): no such run going on: %w", run.ID, run.Job, backstop.ErrNotFound)
	}
	return nil
}

// StoreID returns this store's identity: a random id made once, when the
// store was created (or upgraded to schema 12), and kept in the database.
// Processes of several stores sharing one Redis scope their keys with it.
func (db *DB) StoreID(ctx context.Context) (string, error) {
	var id string
	if err := db.r.GetContext(ctx, &id, `SELECT store_id FROM store_meta WHERE id = 1`); err != nil {
		return "", fmt.Errorf("read store id: %w", err)
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
// but skipped, so also one still running), or, when every stored run was skipped, the newest skipped
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

// LastJobRunID returns the id of the newest run of job that ran to its end
// (ok or failed), 0 when none is stored. Ids follow the order runs were
// stored in, whatever the clocks of the processes that ran them.
func (db *DB) LastJobRunID(ctx context.Context, job string) (int64, error) {
	var id int64
	if err := db.r.GetContext(ctx, &id, `SELECT coalesce(max(id), 0) FROM job_runs
		WHERE job = ? AND (status = 'ok' OR status = 'failed')`, job); err != nil {
		return 0, fmt.Errorf("last run of job %s: %w", job, err)
	}
	return id, nil
}

// PruneJobRuns deletes the job runs started before before and returns how
// many it deleted. It deletes in chunks, each in a transaction of its own,
// so a big backlog does not hold the writer (and the intake's commits)
// for seconds: on error, the count says how many were deleted before it.
func (db *DB) PruneJobRuns(ctx context.Context, before time.Time) (int64, error) {
	n, err := db.pruneChunked(ctx, `DELETE FROM job_runs WHERE id IN (
		SELECT id FROM job_runs WHERE started_at < ? LIMIT ?)`, before)
	if err != nil {
		return n, fmt.Errorf("prune job runs: %w", err)
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
// need not be passed, since the mirror already holds their version. An
// event whose object the mirror holds in a newer version by the time the
// transaction runs (a webhook's, committed after the caller compared) is
// left out as backstop.EmitSuperseded, as in EmitChanged. Results are in
// the order of events. On error nothing is committed, neither the
// events nor the cursor. It fails as Emit does, and on a cursor of an
// unknown resource or kind.
func (db *DB) EmitPage(ctx context.Context, events []backstop.Event, routes []backstop.Route, cur backstop.Cursor) ([]backstop.EmitResult, error) {
	_, res, _, err := db.emitPageAt(ctx, anyGeneration, nil, events, routes, cur)
	if err != nil {
		return nil, fmt.Errorf("emit %s page: %w", cur.Resource, err)
	}
	return res, nil
}

// emitInTx runs the emit path's per-event steps (emitTx, shared with Emit)
// for events inside tx.
func (db *DB) emitInTx(ctx, sctx context.Context, tx *sqlx.Tx, now time.Time, stamp string, events []backstop.Event, routes []backstop.Route) ([]backstop.EmitResult, error) {
	et := &emitTx{
		db:     db,
		tx:     tx,
		mirror: db.mirrorWriter(tx, now),
		queue:  db.outboxQueue(tx, stamp),
		now:    now,
		stamp:  stamp,
	}
	for i, ev := range events {
		if err := checkEvent(ev); err != nil {
			return nil, fmt.Errorf("event %d of %d (%s): %w", i+1, len(events), ev.ID, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	inserted, err := et.insertEvents(sctx, events)
	if err != nil {
		return nil, err
	}
	// A duplicate's version was processed before it when an event before
	// it in the batch was inserted with it, or when the store held it
	// before the batch: not when an event after it was inserted with it.
	var batchKeys map[string]int // the dedup keys inserted by the batch, at their event's index
	out := make([]backstop.EmitResult, len(events))
	for i, ev := range events {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		taken := func(key string) (bool, error) {
			if batchKeys == nil {
				batchKeys = make(map[string]int)
				for j, ev := range events {
					if k := ev.DedupKey(); inserted[j] && k != "" {
						batchKeys[k] = j
					}
				}
			}
			if j, ok := batchKeys[key]; ok {
				return j < i, nil
			}
			var processed bool
			err := tx.QueryRowxContext(sctx, processedVersionSQL, key).Scan(&processed)
			return processed, err
		}
		r, err := et.emit(sctx, ev, routes, i, inserted[i], taken)
		if err != nil {
			return nil, fmt.Errorf("event %d of %d (%s): %w", i+1, len(events), ev.ID, err)
		}
		out[i] = r
	}
	if err := et.queue.flush(sctx, out); err != nil {
		return nil, err
	}
	return out, nil
}

// nullCount is *n, or NULL when n is nil.
func nullCount(n *int) any {
	if n == nil {
		return nil
	}
	return *n
}
