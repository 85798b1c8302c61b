package dashboard

import (
	"context"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sinks/delivery"
)

// Backend is everything the dashboard shows and does. cmd implements it
// over the store, the dispatcher, the job scheduler and the governor; the
// dashboard itself reaches none of them directly.
type Backend interface {
	// Deliveries returns the deliveries f selects, newest first.
	Deliveries(ctx context.Context, f DeliveryFilter) ([]delivery.Row, error)
	// Delivery returns one delivery; ok is false when there is none.
	Delivery(ctx context.Context, id int64) (row delivery.Row, ok bool, err error)
	// Attempts returns the attempts of a delivery, redirects included,
	// oldest first.
	Attempts(ctx context.Context, id int64) ([]delivery.Attempt, error)
	// LastAttempts returns the last n attempts of a delivery, redirects
	// included, oldest first, and how many it has in all, reading only
	// those n.
	LastAttempts(ctx context.Context, id int64, n int) (attempts []delivery.Attempt, total int, err error)
	// Targets returns the configured targets with their state, then the
	// targets no longer configured that still have deliveries
	// (Unconfigured set). Their deliveries are counted by status only
	// when counts is true (counting reads every row of the outbox);
	// otherwise the counts are zero.
	Targets(ctx context.Context, counts bool) ([]Target, error)
	// Retry requeues the delivery seen, only while its status and
	// UpdatedAt are still those of seen, and reports whether it did. It
	// wraps backstop.ErrNotFound for an unknown delivery, and
	// backstop.ErrInFlight (a *backstop.InFlightError), changing nothing,
	// while it is claimed for sending (its attempt in flight).
	Retry(ctx context.Context, seen delivery.Row) (bool, error)
	// RetryDead requeues every dead letter of target that was one at
	// shown (when the page offering it was rendered) and returns how many.
	RetryDead(ctx context.Context, target string, shown time.Time) (int64, error)
	// Redirect sends the delivery once to url and returns the attempt, as
	// delivery.Dispatcher.Redirect does.
	Redirect(ctx context.Context, row delivery.Row, url string) (delivery.Attempt, error)

	// Jobs returns the configured jobs with their next run and their
	// last runs (at most runs of them), newest first.
	Jobs(ctx context.Context, runs int) ([]Job, error)
	// RunJob runs a job now and returns when it ends; it calls started,
	// once, when the run has started (not before it is known not to be
	// refused), and waiting, before that, when the run is not refused but
	// waits that long first (its lock in Redis is new there: see
	// sync.RedisJobLocks.LockJob). It wraps ErrUnknownJob for a name that
	// is not configured, and ErrJobRunning when the job is running
	// already, so this run did not start.
	RunJob(ctx context.Context, name string, started func(), waiting func(time.Duration)) error
	// ReconcileRuns returns the last reconcile reports, newest first.
	ReconcileRuns(ctx context.Context, limit int) ([]ReconcileRun, error)
	// Cursors returns the saved cursors of every resource.
	Cursors(ctx context.Context) ([]backstop.Cursor, error)
	// RevokeSession ends the session id (signed out) before it expires at
	// expires; SessionRevoked reports whether id was ended so.
	RevokeSession(ctx context.Context, id string, expires time.Time) error
	SessionRevoked(ctx context.Context, id string) (bool, error)

	// JobsLeader says whether this process runs the scheduled jobs when
	// several serve processes elect one (governor.redis).
	JobsLeader() JobsLeader

	// Quota returns each API key's budget now and its samples taken at
	// or after since.
	Quota(ctx context.Context, since time.Time) ([]KeyQuota, error)
	// Intake returns the events processed since since by origin, in
	// periods of the given length, and the intake's samples.
	Intake(ctx context.Context, since time.Time, period time.Duration) (IntakeStats, error)
}

// DeliveryFilter selects deliveries. Zero fields select everything.
type DeliveryFilter struct {
	Status    string
	Target    string
	EventType string
	// DeliveredSince leaves out the delivered deliveries queued before
	// it; queued ones and dead letters are listed whatever their age.
	DeliveredSince time.Time
	Limit          int
	// Before, when positive, selects the deliveries older than delivery
	// Before (a smaller id); After the Limit oldest of those newer than
	// delivery After. Pages are so drawn from the last (or first) row
	// shown, and deliveries queued meanwhile do not shift them.
	Before, After int64
}

// Target is a delivery target and its queue.
type Target struct {
	delivery.TargetState
	// URL is the target's URL with any password hidden; empty when
	// Unconfigured.
	URL string
	// Unconfigured is true for a target removed from (or renamed in) the
	// configuration whose deliveries are still kept: no worker sends
	// them, and they cannot be retried.
	Unconfigured bool
}

// Job is a configured job, when it runs next and how its last runs went.
type Job struct {
	Name      string
	Kind      string
	Resources []string
	Schedule  string
	NextRun   time.Time
	// Running reports a run in progress: one the dashboard started, or a
	// stored run still running (a scheduled one).
	Running bool
	Runs    []JobRun
}

// JobRun is one stored run of a job.
type JobRun struct {
	StartedAt, FinishedAt time.Time
	// Status is "ok", "failed", "interrupted" or "skipped".
	Status string
	Counts backstop.JobCounts
	Error  string
	// Output is the file a backup job's run wrote, or the resources a
	// backfill job's found done already; empty otherwise.
	Output string
	// Stale is set for a run stored as running that is not going on: its
	// process is known to be gone, or it has missed three heartbeats. It
	// is closed as abandoned by the job's next run when its process is
	// known gone, else an hour after its last heartbeat.
	Stale bool
	// ProcessGone names the process of a stale run known to be gone
	// ("pid 4242 on host vm"); empty when only its heartbeats stopped.
	ProcessGone string
	// HeartbeatAt is the last heartbeat of a run stored as running.
	HeartbeatAt time.Time
}

// JobsLeader is where the scheduled jobs run. Without an election (Elected
// false) this process runs them; with one, only the leader does.
type JobsLeader struct {
	Elected bool
	Leader  bool
}

// ReconcileRun is one stored reconcile report (the fields of
// store.ReconcileRun).
type ReconcileRun struct {
	ID int64
	backstop.ReconcileReport
	FinishedAt time.Time
	// Status is "running", "ok", "failed", "interrupted" or "abandoned"
	// (its process died while it ran).
	Status string
	Error  string
}

// KeyQuota is one API key's rate-limit budget and its history.
type KeyQuota struct {
	// KeyID names the key without revealing it (governor.KeyID).
	KeyID string
	// Live reports that this process paces the key, so the fields below
	// are its budget now; otherwise they are the last sample's.
	Live        bool
	Learned     bool
	Limit       int
	Remaining   int
	Reset       time.Time
	Window      time.Duration
	InFlight    int
	PausedUntil time.Time
	Samples     []QuotaSample
}

// QuotaSample is one sample of a key's budget with what its requests did
// since the previous sample (the fields of store.QuotaSample).
type QuotaSample struct {
	KeyID                 string
	At                    time.Time
	Limit, Remaining      int
	Reset, PausedUntil    time.Time
	Requests, RateLimited int
	ThrottleWait          time.Duration
}

// IntakeStats is what the intake page draws.
type IntakeStats struct {
	ByOrigin []OriginCount
	Samples  []IntakeSample
	// Duplicates and SignatureFailures count since this process started.
	Duplicates, SignatureFailures int
}

// OriginCount is how many events of one origin were processed in the
// period starting at Start (the fields of store.OriginCount).
type OriginCount struct {
	Start  time.Time
	Origin backstop.Origin
	Events int
}

// IntakeSample counts the intake's duplicates and signature failures since
// the previous sample (the fields of store.IntakeSample).
type IntakeSample struct {
	At                time.Time
	Duplicates        int
	SignatureFailures int
}
