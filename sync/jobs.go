package sync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	stdsync "sync"
	"sync/atomic"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"

	"github.com/backstop-sync/backstop"
)

// JobKind is what a job does.
type JobKind string

// The job kinds.
const (
	// JobSync reads each resource's feed from its cursor (SyncEmit).
	JobSync JobKind = "sync"
	// JobReconcile compares a window with the mirror and re-emits (Reconcile).
	JobReconcile JobKind = "reconcile"
	// JobBackfill reads each resource's feed from scratch (Backfill, or
	// BackfillEmit with Emit). Without Emit, a run that would lose events
	// (CheckBackfill) fails before reading anything.
	JobBackfill JobKind = "backfill"
	// JobMaintenance prunes processed events and job runs older than the
	// retention.
	JobMaintenance JobKind = "maintenance"
	// JobBackup writes a consistent copy of the store into a directory
	// (Job.Dir) and keeps the newest Job.Keep of the job's copies there.
	// The store must be a Backuper.
	JobBackup JobKind = "backup"
)

// DefaultBackupKeep is how many of its backups a backup job keeps when
// Job.Keep is zero.
const DefaultBackupKeep = 7

// Job is one configured job. Exactly one of Cron and Every is set.
type Job struct {
	Name string
	Kind JobKind
	// Resources the job works on, in order; empty means backstop.Resources.
	Resources []backstop.Resource
	// Cron is a 5-field cron expression (or a descriptor such as @daily),
	// in the scheduler's local time.
	Cron string
	// Every is a fixed interval.
	Every time.Duration
	// Lookback and Full are Reconcile's options.
	Lookback time.Duration
	Full     bool
	// Emit makes a backfill emit its changes.
	Emit bool
	// Dir is the directory a backup job writes its copies into, each named
	// after the job and the time it was taken: <Name>-20261201T041500Z.db.
	Dir string
	// Keep is how many of its copies in Dir a backup job keeps (the newest;
	// older ones are deleted once a new one is written); zero means
	// DefaultBackupKeep.
	Keep int
}

// Schedule describes when j runs: "cron 0 3 * * *" or "every 1h0m0s".
func (j Job) Schedule() string {
	if j.Cron != "" {
		return "cron " + j.Cron
	}
	return "every " + j.Every.String()
}

func (j Job) resources() []backstop.Resource {
	if len(j.Resources) == 0 {
		return backstop.Resources
	}
	return j.Resources
}

// JobStatus is the result of one job run.
type JobStatus string

// The job run results.
const (
	JobOK     JobStatus = "ok"
	JobFailed JobStatus = "failed"
	// JobInterrupted: the run was cancelled before it finished (Ctrl-C or
	// SIGTERM of backstop run, Stop, a lost lease or lock); what it
	// committed is kept.
	JobInterrupted JobStatus = "interrupted"
	JobSkipped     JobStatus = "skipped" // the job was still running
	// JobRunning is stored when a run starts (JobStore.StartJobRun) and
	// replaced by its result when it ends.
	JobRunning JobStatus = "running"
)

// addRun adds one resource's run and what it emitted to c.
func addRun(c *backstop.JobCounts, st backstop.RunStats, em EmitStats) {
	c.Pages += st.Pages
	c.Objects += st.Objects
	c.New += st.New
	c.Updated += st.Updated
	c.Requests += st.Requests
	c.RateLimited += st.RateLimited
	c.Reemitted += em.Emitted
	c.Suppressed += em.Suppressed
}

// JobRun is one run of a job, as stored.
type JobRun struct {
	ID         int64
	Job        string
	Kind       JobKind
	StartedAt  time.Time
	FinishedAt time.Time
	Status     JobStatus
	Counts     backstop.JobCounts
	// Err is why a failed run failed; nil otherwise.
	Err error
	// Locked says the run holds its job's lock (SchedulerOptions.Locker):
	// no other run of the job is going on anywhere, so the store closes
	// the job's runs left running by a killed process at once.
	Locked bool
	// Output is what the run made or found that its counts do not tell:
	// the file a backup job wrote; for a backfill job, the resources whose
	// backfill had finished already, so that it read nothing of them.
	// Empty otherwise.
	Output string
}

// JobStore keeps job runs and does the maintenance. The store adapter
// implements it (cmd wires store.DB to it).
type JobStore interface {
	// SaveJobRun stores a run that did not start (skipped, or refused by
	// its lock) and returns its id.
	SaveJobRun(ctx context.Context, run JobRun) (int64, error)
	// StartJobRun stores run as running, with a first heartbeat, and
	// returns its id; it closes as abandoned the runs of the same job
	// left running by a process that died (no heartbeat for long, or any
	// when run.Locked).
	StartJobRun(ctx context.Context, run JobRun) (int64, error)
	// JobRunHeartbeat records that the run id is still going.
	JobRunHeartbeat(ctx context.Context, id int64) error
	// FinishJobRun stores the result of the run started as run.ID.
	FinishJobRun(ctx context.Context, run JobRun) error
	// AbandonStaleJobRuns closes the job runs left running by a process
	// that died (no heartbeat for long) and returns how many.
	AbandonStaleJobRuns(ctx context.Context) (int64, error)
	// PruneProcessed deletes processed events received before before.
	PruneProcessed(ctx context.Context, before time.Time) (int64, error)
	// PruneJobRuns deletes job runs started before before.
	PruneJobRuns(ctx context.Context, before time.Time) (int64, error)
	// PruneAttempts deletes delivery attempts made before before (dead
	// letters themselves are kept until retried or purged).
	PruneAttempts(ctx context.Context, before time.Time) (int64, error)
	// PruneDelivered deletes the deliveries delivered before before, with
	// their attempts.
	PruneDelivered(ctx context.Context, before time.Time) (int64, error)
	// AbandonStaleReconciles closes the reconcile runs left running by a
	// process that died (no heartbeat for long) and returns how many.
	AbandonStaleReconciles(ctx context.Context) (int64, error)
	// PruneReconcileRuns deletes reconcile runs started before before,
	// except each resource's last successful one.
	PruneReconcileRuns(ctx context.Context, before time.Time) (int64, error)
}

// Backuper is a JobStore that writes consistent copies of itself (cmd's
// adapter of store.DB is one). Backup jobs need it.
type Backuper interface {
	// BackupTo writes a consistent copy of the store to path, a new file in
	// an existing directory, whole or not at all (an error wrapping
	// fs.ErrExist when path exists), and returns the copy's size in bytes.
	BackupTo(ctx context.Context, path string) (int64, error)
}

// DashboardPruner is a JobStore that also keeps the dashboard's samples and
// revoked sessions (store.DB is one). With it, maintenance prunes the
// quota and intake samples older than SampleRetention and the revoked
// sessions that expired: samples are written by every process that talks
// to the platform (cron runs too), not only by serve's dashboard.
type DashboardPruner interface {
	// PruneSamples deletes the quota and intake samples taken before
	// before and returns how many.
	PruneSamples(ctx context.Context, before time.Time) (int64, error)
	// PruneRevokedSessions deletes the revoked sessions that expired
	// before now and returns how many.
	PruneRevokedSessions(ctx context.Context, now time.Time) (int64, error)
}

// SampleRetention is how long the dashboard's quota and intake samples are
// kept: the dashboard's sampler and maintenance both prune older ones.
const SampleRetention = 14 * 24 * time.Hour

// JobHistory is a JobStore that also tells when a job last ran (store.DB
// is one). With it, a job on an interval (Job.Every) is scheduled from its
// last run rather than from the scheduler's start: its first run comes an
// interval after the last one, or at once when that time has passed. A
// process restarted more often than the interval would otherwise never
// run the job.
type JobHistory interface {
	// LastJobStart returns when the newest run of job that ran to its
	// end (ok or failed) started; ok=false when none is stored.
	LastJobStart(ctx context.Context, job string) (start time.Time, ok bool, err error)
}

// Errors of the scheduler, for errors.Is.
var (
	// ErrUnknownJob: no job of that name is configured.
	ErrUnknownJob = errors.New("sync: unknown job")
	// ErrJobRunning: the job is running already; the run was skipped. It
	// is backstop.ErrJobRunning, which the store returns for a run going
	// on in another process.
	ErrJobRunning = backstop.ErrJobRunning
	// ErrInvalidJob: a job's definition cannot be scheduled.
	ErrInvalidJob = errors.New("sync: invalid job")
)

// DefaultJobHeartbeat is how often a run says it is still going on by
// default (JobStore.JobRunHeartbeat), so that a run left running by a
// process that died is told from one going on in another process.
const DefaultJobHeartbeat = time.Minute

// DefaultStopTimeout is how long Stop waits for running jobs by default.
const DefaultStopTimeout = 30 * time.Second

// DefaultRetention is how long maintenance keeps processed events and job
// runs by default (DESIGN.md: at least 30 days).
const DefaultRetention = 30 * 24 * time.Hour

// SchedulerOptions configure a Scheduler. Engine and Store are required.
type SchedulerOptions struct {
	Engine *Engine
	Store  JobStore
	// Routes are the delivery targets emitted events are queued to.
	Routes []backstop.Route
	Logger *slog.Logger
	// StopTimeout bounds how long Stop waits for running jobs; zero means
	// DefaultStopTimeout.
	StopTimeout time.Duration
	// Retention is maintenance's age limit; zero means DefaultRetention.
	Retention time.Duration
	// Location is the time zone of cron expressions; nil means time.Local.
	Location *time.Location
	// Now defaults to time.Now.
	Now func() time.Time
	// Heartbeat is how often a run beats while it goes on; zero means
	// DefaultJobHeartbeat.
	Heartbeat time.Duration
	// Elector, when set, is asked before every scheduled run, so that of
	// several processes only the leader runs the jobs. If it also has a
	// Campaign(ctx) method (RedisLease), Start runs it in the background
	// until Stop; if it implements Leadership, a scheduled run is
	// cancelled when the leadership it started under ends.
	Elector Elector
	// Locker, when set, is asked for the job's lock before every run,
	// scheduled or through RunJob, so that a job never runs in two
	// processes at once; a run it refuses is stored as skipped.
	Locker JobLocker
}

// Scheduler runs configured jobs under one gocron scheduler, each never
// overlapping with itself: a scheduled run that comes while the job is
// still running (scheduled or through RunJob) is skipped, logged, counted
// and stored as a skipped run. A scheduled run skipped because the job
// runs in another process is tried again once that run would stop holding
// the job were its process gone, unless a run of the job ran to its end
// meanwhile (see scheduled). It is safe for concurrent use.
type Scheduler struct {
	opts  SchedulerOptions
	log   *slog.Logger
	cron  gocron.Scheduler
	jobs  []Job
	state map[string]*jobState

	mu       stdsync.Mutex
	started  bool
	stopped  bool               // Stop was called: no more retries are armed
	campaign context.CancelFunc // stops the elector's campaign
	campDone chan struct{}
}

// campaigner is an Elector that must keep campaigning to hold leadership.
type campaigner interface {
	Campaign(ctx context.Context)
}

// jobState is a job's guard and its gocron handle.
type jobState struct {
	job     Job
	running atomic.Bool
	skipped atomic.Int64
	// skippedRun counts the ticks skipped during the current run: the
	// first is logged as a warning, the rest at debug level (a job far
	// longer than its interval would otherwise log every tick).
	skippedRun atomic.Int64
	handle     gocron.Job

	// The try again of a scheduled run skipped because the job ran in
	// another process (retryLater), under the Scheduler's mu: retry is
	// its timer, nil when none is pending; firedAt is when it fired (zero
	// when it has not), which tells scheduled that the run gocron starts
	// is that try; since is the job's last start (JobHistory) when the run
	// was skipped.
	retry   *time.Timer
	firedAt time.Time
	since   jobMark
}

// NewScheduler validates jobs and registers them with a new gocron
// scheduler, which Start starts. It fails with ErrInvalidJob (wrapped,
// naming the job) on a duplicate or empty name, an unknown kind, a
// schedule that is missing, doubled or unparsable, or an unknown resource.
func NewScheduler(jobs []Job, opts SchedulerOptions) (*Scheduler, error) {
	if opts.Engine == nil || opts.Store == nil {
		return nil, errors.New("sync: new scheduler: Engine and Store are required")
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = DefaultStopTimeout
	}
	if opts.Retention <= 0 {
		opts.Retention = DefaultRetention
	}
	if opts.Location == nil {
		opts.Location = time.Local
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = DefaultJobHeartbeat
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Scheduler{opts: opts, log: log, jobs: jobs, state: make(map[string]*jobState, len(jobs))}
	gopts := []gocron.SchedulerOption{
		gocron.WithLogger(gocronLogger{log}),
		gocron.WithStopTimeout(opts.StopTimeout),
		gocron.WithLocation(opts.Location),
		gocron.WithMonitor(skipMonitor{s}),
	}
	if opts.Elector != nil {
		gopts = append(gopts, gocron.WithDistributedElector(opts.Elector))
	}
	cron, err := gocron.NewScheduler(gopts...)
	if err != nil {
		return nil, fmt.Errorf("sync: new scheduler: %w", err)
	}
	s.cron = cron
	for _, j := range jobs {
		if err := s.add(j); err != nil {
			_ = cron.Shutdown()
			return nil, err
		}
	}
	return s, nil
}

// add validates j and registers it with gocron.
func (s *Scheduler) add(j Job) error {
	if err := s.check(j); err != nil {
		return fmt.Errorf("%w %q: %v", ErrInvalidJob, j.Name, err)
	}
	var def gocron.JobDefinition
	if j.Cron != "" {
		def = gocron.CronJob(j.Cron, false)
	} else {
		def = gocron.DurationJob(j.Every)
	}
	st := &jobState{job: j}
	jopts := []gocron.JobOption{gocron.WithName(j.Name), gocron.WithSingletonMode(gocron.LimitModeReschedule)}
	if j.Cron == "" {
		start, err := s.intervalStart(j)
		if err != nil {
			return err
		}
		if start != nil {
			jopts = append(jopts, gocron.WithStartAt(start))
		}
	}
	h, err := s.cron.NewJob(def, gocron.NewTask(func(ctx context.Context) { s.scheduled(ctx, st) }), jopts...)
	if err != nil {
		return fmt.Errorf("%w %q: %v", ErrInvalidJob, j.Name, err)
	}
	st.handle = h
	s.state[j.Name] = st
	return nil
}

// intervalStart returns when the interval job j runs first, from its last
// run in the store's history (JobHistory): an interval after the start of
// that run, or at once when that is due. nil leaves it to gocron (an
// interval after Start): the store keeps no history, or j never ran.
func (s *Scheduler) intervalStart(j Job) (gocron.StartAtOption, error) {
	h, ok := s.opts.Store.(JobHistory)
	if !ok {
		return nil, nil
	}
	last, ran, err := h.LastJobStart(context.Background(), j.Name)
	if err != nil {
		return nil, fmt.Errorf("sync: job %q: %w", j.Name, err)
	}
	if !ran {
		return nil, nil
	}
	// gocron refuses a start time in the past; one that is due within a
	// second is as good as now.
	next := last.Add(j.Every)
	if next.Before(time.Now().Add(time.Second)) {
		return gocron.WithStartImmediately(), nil
	}
	return gocron.WithStartDateTime(next), nil
}

// check validates one job against the ones added before.
func (s *Scheduler) check(j Job) error {
	if j.Name == "" {
		return errors.New("empty name")
	}
	if _, dup := s.state[j.Name]; dup {
		return errors.New("duplicate name")
	}
	switch j.Kind {
	case JobSync, JobReconcile, JobBackfill, JobMaintenance:
	case JobBackup:
		if j.Dir == "" {
			return errors.New("a backup job needs a directory (dir)")
		}
		if j.Keep < 0 {
			return fmt.Errorf("keep %d: want 1 or more", j.Keep)
		}
		if _, ok := s.opts.Store.(Backuper); !ok {
			return errors.New("this store cannot write backups")
		}
	default:
		return fmt.Errorf("unknown kind %q", j.Kind)
	}
	switch {
	case j.Cron != "" && j.Every != 0:
		return errors.New("both cron and every are set")
	case j.Cron == "" && j.Every <= 0:
		return errors.New("neither cron nor a positive every is set")
	case j.Cron != "":
		if err := gocron.NewDefaultCron(false).IsValid(j.Cron, s.opts.Location, s.opts.Now()); err != nil {
			return fmt.Errorf("cron %q: %v", j.Cron, err)
		}
	}
	for _, r := range j.Resources {
		if !r.Valid() {
			return fmt.Errorf("unknown resource %q", r)
		}
	}
	return nil
}

// Start starts running the jobs on their schedules, and the elector's
// campaign if it has one. It does not block.
func (s *Scheduler) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return
	}
	s.started = true
	if c, ok := s.opts.Elector.(campaigner); ok {
		ctx, cancel := context.WithCancel(context.Background())
		s.campaign, s.campDone = cancel, make(chan struct{})
		go func() {
			defer close(s.campDone)
			c.Campaign(ctx)
		}()
	}
	s.cron.Start()
}

// Stop stops scheduling, cancels the context of the runs in progress (a
// sync finishes its current page and saves its cursor) and waits for them
// up to the stop timeout, then ends the elector's campaign (a lease is
// given up, so another process takes over at once). The Scheduler cannot
// be started again. The error says when runs were still going at the
// timeout.
func (s *Scheduler) Stop() error {
	// No skipped run is tried again after Stop: the pending ones are
	// dropped, and a run that ends during the shutdown arms none.
	s.mu.Lock()
	s.stopped = true
	for _, st := range s.state {
		if st.retry != nil {
			st.retry.Stop()
			st.retry = nil
		}
	}
	s.mu.Unlock()
	err := s.cron.Shutdown()
	s.mu.Lock()
	cancel, done := s.campaign, s.campDone
	s.campaign = nil
	s.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	if err != nil {
		return fmt.Errorf("stop scheduler: %w", err)
	}
	return nil
}

// Jobs returns the configured jobs in configuration order.
func (s *Scheduler) Jobs() []Job { return append([]Job(nil), s.jobs...) }

// Skipped returns how many scheduled runs of job were skipped because it
// was still running.
func (s *Scheduler) Skipped(job string) int64 {
	if st, ok := s.state[job]; ok {
		return st.skipped.Load()
	}
	return 0
}

// NextRun returns when job runs next. While the scheduler runs, and this
// process leads (see below), this is gocron's schedule; before Start it is
// computed from after (the next cron time, or after plus Every), with
// after the last run's start or now. For an interval job whose store keeps
// history (JobHistory), after is the start of its last run that ran to its
// end, and an overdue run is due now, as Start schedules it. On a process
// standing by (its Elector a Leadership whose term has ended, or not
// begun) it is computed so too: its own gocron schedule is not moved on
// by the leader's runs, and reads in the past. It fails with
// ErrUnknownJob.
func (s *Scheduler) NextRun(job string, after time.Time) (time.Time, error) {
	st, ok := s.state[job]
	if !ok {
		return time.Time{}, fmt.Errorf("%w %q", ErrUnknownJob, job)
	}
	s.mu.Lock()
	started := s.started
	s.mu.Unlock()
	if e, ok := s.opts.Elector.(Leadership); ok && started {
		select {
		case <-e.Lost():
			started = false // standing by: the leader's runs are in the store
		default:
		}
	}
	if started {
		if t, err := st.handle.NextRun(); err == nil && !t.IsZero() {
			return t, nil
		}
	}
	if st.job.Cron == "" {
		h, history := s.opts.Store.(JobHistory)
		if history {
			// As Start will schedule it (intervalStart).
			last, ran, err := h.LastJobStart(context.Background(), job)
			if err != nil {
				return time.Time{}, fmt.Errorf("sync: job %q: %w", job, err)
			}
			after = time.Time{}
			if ran {
				after = last
			}
		}
		now := s.opts.Now()
		next := after.Add(st.job.Every)
		switch {
		case after.IsZero(), next.Before(now) && !history:
			return now.Add(st.job.Every), nil // gocron runs it an interval after start
		case next.Before(now):
			return now, nil // overdue: Start runs it at once
		}
		return next, nil
	}
	if after.IsZero() {
		after = s.opts.Now()
	}
	c := gocron.NewDefaultCron(false)
	if err := c.IsValid(st.job.Cron, s.opts.Location, after); err != nil {
		return time.Time{}, err
	}
	now := s.opts.Now()
	if after.Before(now) {
		after = now
	}
	return c.Next(after), nil
}

// RunJob runs job now, whatever its schedule, and returns its stored run.
// A job already running (in this process, or in another one holding its
// lock, see SchedulerOptions.Locker) is not started again: the run is
// stored as skipped and the error is ErrJobRunning. It fails with ErrUnknownJob for
// a name not configured. Otherwise the error is the run's: a run cancelled
// through ctx returns ctx.Err() and is stored as interrupted, any other
// error as failed; an error storing the run is joined to it.
func (s *Scheduler) RunJob(ctx context.Context, job string) (JobRun, error) {
	return s.RunJobNotify(ctx, job, nil)
}

// heldElsewhere is a refusal of a run because its job runs in another
// process (it wraps ErrJobRunning) that tells until when that run holds
// the job should its process be gone (killed, crashed: it stops beating,
// or renewing its lock): store.JobRunningError, and RedisJobLocks'
// refusal.
type heldElsewhere interface {
	error
	HeldUntil() time.Time
}

// retrySlack is how long after HeldUntil a skipped run is tried again: a
// margin for the clocks of the processes that share the store.
const retrySlack = time.Second

// retryFresh is how long after its timer fired a run is taken for the try
// again (rather than for a tick of the schedule): gocron starts it at once,
// unless it refused it (this process not the leader), and then the next
// tick is a tick.
const retryFresh = 10 * time.Second

// retryLater arms the try again of a scheduled run of st's job skipped at
// a time the job's last start was since (JobHistory), because another
// process ran the job: a little after until, when that run stops holding
// the job unless its process lives. So a job whose run was left by a
// process that died elsewhere (another host, an older binary: the store
// cannot tell it is gone) runs minutes later, not an interval later. A
// retry pending already is replaced; none is armed once Stop was called.
func (s *Scheduler) retryLater(st *jobState, until time.Time, since jobMark) {
	s.retryAt(st, until, since, retryStarts)
}

// retryStarts is how many times retryLater asks gocron to start the try
// again when it fails to (its hand-off timed out), a few seconds apart.
const retryStarts = 3

// retryAt is retryLater with tries left for gocron's start.
func (s *Scheduler) retryAt(st *jobState, until time.Time, since jobMark, tries int) {
	wait := max(until.Sub(s.opts.Now()), 0) + retrySlack
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	if st.retry != nil {
		st.retry.Stop()
	}
	st.since = since
	var t *time.Timer
	t = time.AfterFunc(wait, func() {
		s.mu.Lock()
		if s.stopped || st.retry != t {
			s.mu.Unlock()
			return
		}
		st.retry = nil
		if st.running.Load() {
			s.mu.Unlock()
			return // the job runs here now
		}
		fired := time.Now()
		st.firedAt = fired
		s.mu.Unlock()
		// Through gocron, so that the elector is asked, and Stop waits
		// for the run as for a scheduled one.
		if err := st.handle.RunNow(); err != nil {
			// Not started: the next tick is a tick, not this try, and
			// the try is armed again (not once stopped).
			s.mu.Lock()
			if st.firedAt.Equal(fired) {
				st.firedAt = time.Time{}
			}
			s.mu.Unlock()
			s.log.Debug("job: try again of a skipped run not started", "job", st.job.Name, "err", err, "tries_left", tries-1)
			if tries > 1 {
				s.retryAt(st, s.opts.Now().Add(retrySlack), since, tries-1)
			}
		}
	})
	st.retry = t
	s.log.Debug("job: a skipped run is tried again once the other process's run stops holding it",
		"job", st.job.Name, "at", s.opts.Now().Add(wait).Round(time.Second))
}

// takeRetry reports whether the scheduled run starting now is the try
// again of a skipped run (its timer fired moments ago), and the job's
// last start when the run was skipped.
func (s *Scheduler) takeRetry(st *jobState) (retry bool, since jobMark) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fired := st.firedAt
	st.firedAt = time.Time{}
	return !fired.IsZero() && time.Since(fired) < retryFresh, st.since
}

// lastStart returns the job's last start that ran to its end
// (JobHistory), zero when none or unknown.
func (s *Scheduler) lastStart(job string) time.Time {
	h, ok := s.opts.Store.(JobHistory)
	if !ok {
		return time.Time{}
	}
	last, _, err := h.LastJobStart(context.Background(), job)
	if err != nil {
		return time.Time{}
	}
	return last
}

// JobEnds is a JobHistory that also gives the store's id of the newest
// run of a job that ran to its end (store.DB is one): ids are the store's
// own, in the order runs were stored, where start times are those of the
// clocks of the processes that ran them.
type JobEnds interface {
	// LastJobRunID returns the id of the newest run of job that ran to
	// its end (ok or failed), 0 when none is stored.
	LastJobRunID(ctx context.Context, job string) (int64, error)
}

// jobMark is what a job's last run to its end was at a moment: its start
// (JobHistory) and, where the store gives it (JobEnds), its id. A run that
// ended since changes it, even one of a process whose clock is behind
// (whose start sorts before the one it follows).
type jobMark struct {
	start time.Time
	id    int64
}

// same reports whether m and o mark the same last run.
func (m jobMark) same(o jobMark) bool { return m.start.Equal(o.start) && m.id == o.id }

// lastMark returns the job's jobMark now, zero where the store does not
// tell.
func (s *Scheduler) lastMark(job string) jobMark {
	m := jobMark{start: s.lastStart(job)}
	if e, ok := s.opts.Store.(JobEnds); ok {
		if id, err := e.LastJobRunID(context.Background(), job); err == nil {
			m.id = id
		}
	}
	return m
}

// RunJobNotify is RunJob that also calls started, when not nil, once the
// run is past its guards (the job was not running here, its lock is held)
// and stored as running (or, should storing its start fail, as it begins
// all the same), just before its work begins; so a caller that
// answers "started" (the dashboard's Run now) says so only for a run that
// really starts. started is not called for a run refused or failed before
// it began, and it is called on the run's goroutine: it must not block.
func (s *Scheduler) RunJobNotify(ctx context.Context, job string, started func()) (JobRun, error) {
	st, ok := s.state[job]
	if !ok {
		return JobRun{Job: job}, fmt.Errorf("%w %q", ErrUnknownJob, job)
	}
	return s.run(ctx, st, started, false)
}

// scheduled is gocron's task for one job. With an Elector that can lose
// its leadership mid-run (Leadership), the run is cancelled when it does, so
// that it does not go on beside the new leader's.
//
// A run skipped because another process ran the job is tried again once
// that run would stop holding the job were its process gone
// (retryLater). The try does not run when a run of the job ran to its
// end meanwhile (that process's, most often); refused again, it is not
// stored as one more skipped run, only tried again later.
func (s *Scheduler) scheduled(ctx context.Context, st *jobState) {
	retry, since := s.takeRetry(st)
	if retry {
		if last := s.lastMark(st.job.Name); !last.same(since) {
			s.log.Debug("job: the skipped run is not tried again: the job ran to its end meanwhile", "job", st.job.Name)
			return
		}
	} else {
		since = s.lastMark(st.job.Name)
	}
	if e, ok := s.opts.Elector.(Leadership); ok {
		var stop context.CancelFunc
		ctx, stop = whileLeader(ctx, e.Lost())
		defer stop()
	}
	run, err := s.run(ctx, st, nil, retry)
	if held := heldElsewhere(nil); errors.As(err, &held) {
		s.retryLater(st, held.HeldUntil(), since)
	}
	switch {
	case err == nil, errors.Is(err, ErrJobRunning):
	case errors.Is(context.Cause(ctx), ErrNotLeader):
		s.log.Warn("job stopped: this process is no longer the jobs leader", "job", run.Job, "kind", run.Kind)
	case errors.Is(err, ErrJobLockLost):
		s.log.Warn("job stopped: its lock was lost", "job", run.Job, "kind", run.Kind)
	case errors.Is(err, context.Canceled):
		s.log.Info("job stopped", "job", run.Job, "kind", run.Kind)
	default:
		s.log.Error("job failed", "job", run.Job, "kind", run.Kind, "err", err)
	}
}

// errLeaseLost is the cause whileLeader cancels with: it is ErrNotLeader,
// and says what happened, for the stored run's error.
var errLeaseLost error = leaseLost{}

type leaseLost struct{}

func (leaseLost) Error() string {
	return "the jobs lease was lost (not renewed within governor.job_lease: Redis not answering, or another serve holds it now)"
}

func (leaseLost) Is(target error) bool { return target == ErrNotLeader }

// whileLeader returns ctx, cancelled with cause errLeaseLost (ErrNotLeader)
// when lost closes; stop releases it and must be called.
func whileLeader(ctx context.Context, lost <-chan struct{}) (_ context.Context, stop context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-lost:
			cancel(errLeaseLost)
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// run runs st's job once under its guard and stores the run; started,
// when not nil, is called as its work begins (see RunJobNotify). A retry
// (the try again of a skipped run, see scheduled) that is refused is not
// stored, nor logged above debug.
func (s *Scheduler) run(ctx context.Context, st *jobState, started func(), retry bool) (JobRun, error) {
	j := st.job
	run := JobRun{Job: j.Name, Kind: j.Kind, StartedAt: s.opts.Now()}
	skip := func(why error) int64 {
		if retry {
			s.log.Debug("job still running: the try again of a skipped run is given up or tried again later",
				"job", j.Name, "kind", j.Kind, "err", why)
			return 0
		}
		return s.skipBecause(ctx, st, why)
	}
	if !st.running.CompareAndSwap(false, true) {
		run.ID = skip(nil)
		run.Status, run.FinishedAt, run.Err = JobSkipped, run.StartedAt, ErrJobRunning
		return run, fmt.Errorf("job %s: %w", j.Name, ErrJobRunning)
	}
	defer st.running.Store(false)
	st.skippedRun.Store(0)
	log := s.log.With("job", j.Name, "kind", j.Kind)
	if s.opts.Locker != nil {
		lctx, release, err := s.opts.Locker.LockJob(ctx, j.Name)
		if errors.Is(err, ErrJobRunning) {
			run.ID = skip(err) // it names the run that holds the lock
			run.Status, run.FinishedAt, run.Err = JobSkipped, run.StartedAt, err
			return run, err
		}
		if err != nil {
			run.Status, run.FinishedAt, run.Err = runStatus(ctx, err), s.opts.Now(), err
			id, serr := s.opts.Store.SaveJobRun(context.WithoutCancel(ctx), run)
			run.ID = id
			return run, errors.Join(err, serr)
		}
		defer release()
		ctx = lctx
		run.Locked = true
		// The run starts once it holds the lock, which LockJob may have
		// waited for (RedisJobLocks.fence): its stored span is the one
		// that never overlaps another process's run.
		run.StartedAt = s.opts.Now()
	}
	// The run is stored as running from its start, and beats while it
	// goes on: a process killed mid-run leaves a trace, closed as
	// abandoned once its heartbeat is old.
	// Should its start not be stored (the store busy past its timeout, a
	// full disk), the run still runs, and is stored in one go when it
	// ends, as a run that did not start is.
	id, err := s.opts.Store.StartJobRun(context.WithoutCancel(ctx), run)
	if errors.Is(err, ErrJobRunning) {
		// Going on in another process sharing the store (no lock in
		// Redis to tell): skipped, as here.
		err = fmt.Errorf("job %s: %w in another process", j.Name, err)
		run.ID = skip(err)
		run.Status, run.FinishedAt, run.Err = JobSkipped, run.StartedAt, err
		return run, err
	}
	stored := err == nil
	stopBeat := func() {}
	live := &runProgress{}
	if stored {
		run.ID = id
		if n, ok := s.opts.Locker.(runNamer); ok && run.Locked {
			// The lock was taken before the run was stored: a run
			// refused for it names this one from now on.
			n.nameRun(ctx, j.Name, id)
		}
		stopBeat = s.heartbeat(ctx, id, log, live)
		log.Info("job started", "run", id)
	} else {
		log.Error("job started, but its start could not be stored: it is stored when it ends", "err", err)
	}
	if started != nil {
		started()
	}
	if j.Kind == JobBackup {
		run.Output, err = s.backup(ctx, j, &run.Counts, log)
	} else {
		run.Counts, run.Output, err = s.work(ctx, j, live)
	}
	stopBeat()
	run.FinishedAt = s.opts.Now()
	run.Status = runStatus(ctx, err)
	// A run cancelled for a reason of its own (its lock lost, the jobs
	// leadership lost) says so, rather than a bare "context canceled".
	if cause := context.Cause(ctx); err != nil && ctx.Err() != nil && cause != nil && cause != ctx.Err() && !errors.Is(err, cause) {
		err = fmt.Errorf("%w: %w", cause, err)
	}
	run.Err = err
	var serr error
	if stored {
		serr = s.opts.Store.FinishJobRun(context.WithoutCancel(ctx), run)
	} else {
		run.ID, serr = s.opts.Store.SaveJobRun(context.WithoutCancel(ctx), run)
	}
	if serr != nil {
		err = errors.Join(err, fmt.Errorf("job %s: store run: %w", j.Name, serr))
	}
	// Counts.Reemitted holds a sync's or a backfill's emitted events too
	// (JobCounts has one field for both): the log names them as run does.
	emitted := "emitted"
	if j.Kind == JobReconcile {
		emitted = "reemitted"
	}
	attrs := []any{"status", run.Status, "duration", run.FinishedAt.Sub(run.StartedAt).Round(time.Millisecond).String(),
		"pages", run.Counts.Pages, "objects", run.Counts.Objects, emitted, run.Counts.Reemitted,
		"suppressed", run.Counts.Suppressed, "pruned", run.Counts.Pruned}
	if run.Output != "" {
		attrs = append(attrs, "output", run.Output)
	}
	if err != nil {
		// The line says why on its own (under backstop run the error is
		// printed apart from it).
		attrs = append(attrs, "error", err.Error())
	}
	if run.Status == JobFailed {
		log.Warn("job finished", attrs...) // the run did not do its work
	} else {
		log.Info("job finished", attrs...)
	}
	return run, err
}

// heartbeat beats the run id every Heartbeat until stop is called (or ctx
// ends); a failed beat is logged once.
func (s *Scheduler) heartbeat(ctx context.Context, id int64, log *slog.Logger, live *runProgress) (stop func()) {
	beat := s.opts.Store.JobRunHeartbeat
	if ps, ok := s.opts.Store.(JobProgressStore); ok {
		beat = func(ctx context.Context, id int64) error { return ps.JobRunProgress(ctx, id, live.snapshot()) }
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(s.opts.Heartbeat)
		defer t.Stop()
		warned := false
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := beat(ctx, id); err != nil && ctx.Err() == nil && !warned {
				warned = true
				log.Warn("job run heartbeat", "run", id, "err", err)
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// runStatus is the status of a run that ended with err under ctx: a run
// stopped by its context's cancellation (whatever the cause) is
// interrupted, not failed.
func runStatus(ctx context.Context, err error) JobStatus {
	switch {
	case err == nil:
		return JobOK
	case ctx.Err() != nil && onlyCanceled(err):
		return JobInterrupted
	}
	return JobFailed
}

// onlyCanceled reports whether err is a cancellation and, when it joins
// several errors (one per resource), whether each of them is.
func onlyCanceled(err error) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !onlyCanceled(e) {
				return false
			}
		}
		return true
	}
	return errors.Is(err, context.Canceled)
}

// skip counts, logs and stores a skipped run of st's job, and returns the
// stored run's id (0 when it could not be stored).
func (s *Scheduler) skip(ctx context.Context, st *jobState) int64 {
	return s.skipBecause(ctx, st, nil)
}

// skipBecause is skip that logs why, when why is not nil.
func (s *Scheduler) skipBecause(ctx context.Context, st *jobState, why error) int64 {
	n := st.skipped.Add(1)
	level := slog.LevelWarn
	if st.skippedRun.Add(1) > 1 {
		level = slog.LevelDebug
	}
	attrs := []any{"job", st.job.Name, "kind", st.job.Kind, "skipped", n}
	if why != nil {
		attrs = append(attrs, "err", why)
	}
	s.log.Log(ctx, level, "job still running: run skipped", attrs...)
	now := s.opts.Now()
	run := JobRun{Job: st.job.Name, Kind: st.job.Kind, StartedAt: now, FinishedAt: now, Status: JobSkipped, Err: why}
	id, err := s.opts.Store.SaveJobRun(context.WithoutCancel(ctx), run)
	if err != nil {
		s.log.Error("store skipped run", "job", st.job.Name, "err", err)
	}
	return id
}

// BackfillDone begins the Output of a backfill job's run that found some
// of its resources' backfills finished already, and read nothing of them.
const BackfillDone = "already done, nothing read"

// work does j's work over its resources, and returns its counts and the
// run's Output. A failing resource does not stop the others (except on
// cancellation); the errors are joined.
func (s *Scheduler) work(ctx context.Context, j Job, live *runProgress) (backstop.JobCounts, string, error) {
	var c backstop.JobCounts
	e := live.engine(s.opts.Engine)
	if j.Kind == JobMaintenance {
		return c, "", s.maintain(ctx, &c)
	}
	var done []string // backfills finished before this run
	var errs []error
	if j.Kind == JobBackfill && !j.Emit {
		// A backfill that would lose events fails the run before it reads
		// anything (CheckBackfill).
		for _, r := range j.resources() {
			if err := e.CheckBackfill(ctx, r, false, s.opts.Routes); err != nil {
				if errors.Is(err, ErrSilentBackfill) {
					err = fmt.Errorf("%w; set emit: true on job %s to emit them", err, j.Name)
				}
				errs = append(errs, err)
			}
		}
		if len(errs) > 0 {
			return c, "", errors.Join(errs...)
		}
	}
	for _, r := range j.resources() {
		if err := ctx.Err(); err != nil {
			if len(errs) == 0 { // else the resource cut short said so already
				errs = append(errs, err)
			}
			break
		}
		var err error
		switch j.Kind {
		case JobSync:
			var st backstop.RunStats
			var em EmitStats
			st, em, err = e.SyncEmit(ctx, r, s.opts.Routes)
			addRun(&c, st, em)
		case JobBackfill:
			var st backstop.RunStats
			var em EmitStats
			if j.Emit {
				st, em, err = e.BackfillEmit(ctx, r, false, s.opts.Routes)
			} else {
				st, em, err = e.BackfillQuiet(ctx, r, false, s.opts.Routes)
			}
			if err == nil && st.AlreadyDone {
				done = append(done, string(r))
			}
			addRun(&c, st, em)
		case JobReconcile:
			var rep ReconcileReport
			rep, err = e.Reconcile(ctx, r, ReconcileOptions{Lookback: j.Lookback, Full: j.Full, Routes: s.opts.Routes})
			if j.Full && err == nil {
				// Counted at the end of each resource's full run: the
				// run's count is of the resources that got there.
				n := rep.Orphans
				if c.Orphans != nil {
					n += *c.Orphans
				}
				c.Orphans = &n
			}
			c.Pages += rep.Pages
			c.Objects += rep.Scanned
			c.Missing += rep.Missing
			c.Behind += rep.Behind
			c.Reemitted += rep.Reemitted
			c.Suppressed += rep.Suppressed
			c.Requests += rep.Requests
			c.RateLimited += rep.RateLimited
		}
		live.finished(c)
		if err != nil {
			errs = append(errs, err)
		}
	}
	var out string
	if len(done) > 0 {
		// A backfill job is one pass: once done it reads nothing again,
		// and an ok with nothing read should say why.
		emit := ""
		for _, r := range done {
			if flag := e.restartEmit(ctx, backstop.Resource(r), j.Emit, s.opts.Routes); flag != "" {
				emit = flag
			}
		}
		out = fmt.Sprintf("%s: %s (%s backfill RESOURCE --restart%s reads one again)", BackfillDone, strings.Join(done, ", "), e.command(), emit)
	}
	return c, out, errors.Join(errs...)
}

// JobProgressStore is a JobStore that stores a running run's counts so far
// with its heartbeat (store.DB is one). With it, a run killed midway is
// closed as abandoned with what it had done, and backstop jobs shows a
// running run's counts.
type JobProgressStore interface {
	// JobRunProgress is JobRunHeartbeat that also stores c as the run's
	// counts.
	JobRunProgress(ctx context.Context, id int64, c backstop.JobCounts) error
}

// runProgress is a job run's counts as it goes: those of its finished
// resources and, from its pages, the one going on. Its heartbeat stores
// them (JobProgressStore).
type runProgress struct {
	mu      stdsync.Mutex
	done    backstop.JobCounts // the finished resources'
	current backstop.JobCounts // the resource going on, as of its last page
}

// engine returns e, or a copy of it whose page callbacks also record the
// run's progress into p (e's own callbacks, the CLI's progress, still
// run first).
func (p *runProgress) engine(e *Engine) *Engine {
	if p == nil {
		return e
	}
	cp := *e
	onPage, onReconcilePage := e.OnPage, e.OnReconcilePage
	cp.OnPage = func(st backstop.RunStats) {
		if onPage != nil {
			onPage(st)
		}
		p.page(backstop.JobCounts{Pages: st.Pages, Objects: st.Objects, New: st.New, Updated: st.Updated,
			Requests: st.Requests, RateLimited: st.RateLimited})
	}
	cp.OnReconcilePage = func(rep ReconcileReport) {
		if onReconcilePage != nil {
			onReconcilePage(rep)
		}
		p.page(backstop.JobCounts{Pages: rep.Pages, Objects: rep.Scanned, Missing: rep.Missing, Behind: rep.Behind,
			Reemitted: rep.Reemitted, Suppressed: rep.Suppressed, Requests: rep.Requests, RateLimited: rep.RateLimited})
	}
	return &cp
}

// page records the totals so far of the resource going on.
func (p *runProgress) page(c backstop.JobCounts) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.current = c
}

// finished records the totals of the resources finished so far.
func (p *runProgress) finished(c backstop.JobCounts) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done, p.current = c, backstop.JobCounts{}
}

// snapshot returns the run's counts so far.
func (p *runProgress) snapshot() backstop.JobCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, x := p.done, p.current
	c.Pages += x.Pages
	c.Objects += x.Objects
	c.New += x.New
	c.Updated += x.Updated
	c.Missing += x.Missing
	c.Behind += x.Behind
	c.Reemitted += x.Reemitted
	c.Suppressed += x.Suppressed
	c.Pruned += x.Pruned
	c.Requests += x.Requests
	c.RateLimited += x.RateLimited
	return c
}

// maintain closes the reconcile and job runs left running by a process
// that died, prunes processed events, job runs and reconcile runs (but
// the last successful one of each resource) older than the retention, and
// delivery attempts and delivered deliveries older than AttemptRetention
// (the delivery log's 14 days); with a DashboardPruner, also the
// dashboard's samples older than SampleRetention and the revoked sessions
// that expired.
func (s *Scheduler) maintain(ctx context.Context, c *backstop.JobCounts) error {
	before := s.opts.Now().Add(-s.opts.Retention)
	n, err := s.opts.Store.PruneProcessed(ctx, before)
	c.Pruned += n
	if err != nil {
		return err
	}
	n, err = s.opts.Store.PruneJobRuns(ctx, before)
	c.Pruned += n
	if err != nil {
		return err
	}
	abandoned, err := s.opts.Store.AbandonStaleReconciles(ctx)
	if err != nil {
		return err
	}
	if abandoned > 0 {
		s.log.Info("closed reconcile runs whose process died as abandoned", "runs", abandoned)
	}
	if abandoned, err = s.opts.Store.AbandonStaleJobRuns(ctx); err != nil {
		return err
	}
	if abandoned > 0 {
		s.log.Info("closed job runs whose process died as abandoned", "runs", abandoned)
	}
	n, err = s.opts.Store.PruneReconcileRuns(ctx, before)
	c.Pruned += n
	if err != nil {
		return err
	}
	logBefore := s.opts.Now().Add(-AttemptRetention)
	n, err = s.opts.Store.PruneDelivered(ctx, logBefore)
	c.Pruned += n
	if err != nil {
		return err
	}
	n, err = s.opts.Store.PruneAttempts(ctx, logBefore)
	c.Pruned += n
	if err != nil {
		return err
	}
	dp, ok := s.opts.Store.(DashboardPruner)
	if !ok {
		return nil
	}
	now := s.opts.Now()
	n, err = dp.PruneSamples(ctx, now.Add(-SampleRetention))
	c.Pruned += n
	if err != nil {
		return err
	}
	n, err = dp.PruneRevokedSessions(ctx, now)
	c.Pruned += n
	return err
}

// AttemptRetention is how long maintenance keeps delivery attempts, and
// the deliveries that were delivered.
const AttemptRetention = 14 * 24 * time.Hour

// skipMonitor counts gocron's singleton reschedules as skipped runs.
type skipMonitor struct{ s *Scheduler }

// IncrementJob implements gocron.Monitor.
func (m skipMonitor) IncrementJob(_ uuid.UUID, name string, _ []string, status gocron.JobStatus) {
	if status != gocron.SingletonRescheduled {
		return
	}
	if st, ok := m.s.state[name]; ok {
		m.s.skip(context.Background(), st)
	}
}

// RecordJobTiming implements gocron.Monitor.
func (skipMonitor) RecordJobTiming(time.Time, time.Time, uuid.UUID, string, []string) {}

// gocronLogger adapts slog to gocron.Logger. gocron's messages carry their
// own "gocron: " prefix; its Info messages (scheduler created, started,
// stopped) are lifecycle chatter and are logged at Debug.
type gocronLogger struct{ l *slog.Logger }

func (g gocronLogger) Debug(msg string, args ...any) { g.l.Debug(msg, args...) }
func (g gocronLogger) Info(msg string, args ...any)  { g.l.Debug(msg, args...) }
func (g gocronLogger) Warn(msg string, args ...any)  { g.l.Warn(msg, args...) }
func (g gocronLogger) Error(msg string, args ...any) { g.l.Error(msg, args...) }
