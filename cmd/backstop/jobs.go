package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/cmd/backstop/config"
	"github.com/backstop-sync/backstop/store"
	bsync "github.com/backstop-sync/backstop/sync"
)

func (m *Main) jobsCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "jobs",
		Short: "List the configured jobs with their schedule, next run and last result",
		Long: `jobs lists the jobs of schedules.yaml (jobs:) with their kind, schedule, the
time of their next run (as backstop serve would schedule it), and their last
stored run and its result (with the start of its error when it failed or was
interrupted; --json has the whole error). Runs are stored by backstop serve
and backstop run.

A job on an interval (every:) that has not yet run to its end (ok or failed)
first runs an interval after serve starts, which this command cannot know:
its next run reads "1m after serve starts" (for every: 1m), and is null in
--json.`,
		Example: "  backstop jobs\n  backstop jobs --json",
		Args:    cobraArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			a, err := m.openAppLocal(ctx, g, m.Stderr)
			if err != nil {
				return err
			}
			defer a.Close()
			// Its next runs would be as wrong as serve's.
			if e := a.cfg.ScheduleProblem(); e != nil {
				return usageError{e}
			}
			s, err := a.scheduler()
			if err != nil {
				return err
			}
			defer s.Stop()
			rows, err := jobRows(ctx, a.db, s)
			if err != nil {
				return err
			}
			return printJobs(m.Stdout, rows, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the jobs as JSON")
	return cmd
}

// jobStore adapts store.DB to the scheduler's JobStore; every run it saves
// is also exported as metrics when metrics is set.
type jobStore struct {
	*store.DB
	metrics *jobMetrics
}

var _ bsync.JobEnds = jobStore{}

// SaveJobRun stores run with store.DB.SaveJobRun.
func (s jobStore) SaveJobRun(ctx context.Context, run bsync.JobRun) (int64, error) {
	r := store.JobRun{Job: run.Job, Kind: string(run.Kind), StartedAt: run.StartedAt, FinishedAt: run.FinishedAt,
		Status: string(run.Status), Counts: run.Counts, Output: run.Output}
	if run.Err != nil {
		r.Error = run.Err.Error()
	}
	s.metrics.observe(run)
	return s.DB.SaveJobRun(ctx, r)
}

// StartJobRun stores run as running with store.DB.StartJobRun.
func (s jobStore) StartJobRun(ctx context.Context, run bsync.JobRun) (int64, error) {
	return s.DB.StartJobRun(ctx, store.JobRun{Job: run.Job, Kind: string(run.Kind), StartedAt: run.StartedAt, Locked: run.Locked})
}

// FinishJobRun stores the end of run with store.DB.FinishJobRun.
func (s jobStore) FinishJobRun(ctx context.Context, run bsync.JobRun) error {
	r := store.JobRun{ID: run.ID, Job: run.Job, Kind: string(run.Kind), StartedAt: run.StartedAt, FinishedAt: run.FinishedAt,
		Status: string(run.Status), Counts: run.Counts, Output: run.Output}
	if run.Err != nil {
		r.Error = run.Err.Error()
	}
	s.metrics.observe(run)
	return s.DB.FinishJobRun(ctx, r)
}

// BackupTo writes a backup of the store to path with store.DB.Backup, for
// backup jobs (bsync.Backuper).
func (s jobStore) BackupTo(ctx context.Context, path string) (int64, error) {
	info, err := s.DB.Backup(ctx, path)
	return info.Bytes, err
}

// schedulerJobs converts the configured jobs for the scheduler.
func schedulerJobs(jobs []config.Job) []bsync.Job {
	out := make([]bsync.Job, len(jobs))
	for i, j := range jobs {
		out[i] = bsync.Job{
			Name: j.Name, Kind: bsync.JobKind(j.Kind), Resources: j.Resources, Cron: j.Cron,
			Every: j.Every.Std(), Lookback: j.Lookback.Std(), Full: j.Full, Emit: j.Emit,
			Dir: j.Dir, Keep: j.Keep,
		}
	}
	return out
}

// scheduler builds the process's one scheduler with the configured jobs,
// not started. A job it cannot schedule is a configuration error (exit 2).
func (a *app) scheduler() (*bsync.Scheduler, error) { return a.schedulerWith(nil) }

// schedulerWith is scheduler with job runs exported on metrics (nil: none).
// With governor.redis, only the holder of the jobs lease runs scheduled
// jobs, so that several serve processes run each tick once (a process
// with no jobs never asks for it); the lease is
// per store (store.DB.StoreID: processes of other stores on the same API
// key and Redis run their own jobs) and lasts governor.job_lease. Every
// run, scheduled or started by hand (`backstop run`, the dashboard's Run
// now), also takes its job's lock in Redis, per store too, so a job never
// runs in two processes at once.
func (a *app) schedulerWith(metrics *jobMetrics) (*bsync.Scheduler, error) {
	log := a.log.With("component", "jobs")
	var elector bsync.Elector
	var locker bsync.JobLocker
	if a.rdb != nil {
		storeID, err := a.db.StoreID(context.Background())
		if err != nil {
			return nil, err
		}
		ttl := a.cfg.Governor.JobLease.Std()
		// A process with no jobs (a serve that only takes webhooks)
		// does not ask for the lease: holding it, it would keep every
		// other serve's jobs from running.
		if a.lease == nil && len(a.cfg.Jobs) > 0 {
			lease, err := bsync.NewRedisLease(a.rdb, bsync.LeaseOptions{Key: jobLeaseKey(storeID), TTL: ttl, Logger: log})
			if err != nil {
				return nil, usageError{fmt.Errorf("governor.job_lease: %w", err)}
			}
			a.lease = lease
		}
		if a.lease != nil {
			elector = a.lease
		}
		locks, err := bsync.NewRedisJobLocks(a.rdb, bsync.LeaseOptions{Key: jobLockPrefix(storeID), TTL: ttl, Logger: log})
		if err != nil {
			return nil, usageError{fmt.Errorf("governor.job_lease: %w", err)}
		}
		locker = locks
	}
	s, err := bsync.NewScheduler(schedulerJobs(a.cfg.Jobs), bsync.SchedulerOptions{
		Engine:  a.engine,
		Store:   jobStore{DB: a.db, metrics: metrics},
		Routes:  routesOf(a.cfg),
		Logger:  log,
		Elector: elector,
		Locker:  locker,
	})
	if errors.Is(err, bsync.ErrInvalidJob) {
		return nil, usageError{err}
	}
	return s, err
}

// jobLeaseKey is the Redis key of the jobs lease of the store storeID:
// backstop:jobs:leader:<store id>. The store, not the API key, scopes it:
// serve processes of one store elect one leader whatever key each holds,
// and those of another store elect their own.
func jobLeaseKey(storeID string) string { return bsync.DefaultLeaseKey + ":" + storeID }

// jobLockPrefix starts the Redis keys of the job locks of the store
// storeID: backstop:jobs:lock:<store id>:<job>. A run by hand that holds
// no API key (a maintenance job) takes the same lock as serve's.
func jobLockPrefix(storeID string) string { return bsync.DefaultJobLockPrefix + storeID + ":" }

// jobRow is one line of `backstop jobs`.
type jobRow struct {
	Name      string   `json:"name"`
	Kind      string   `json:"kind"`
	Resources []string `json:"resources,omitempty"`
	Schedule  string   `json:"schedule"`
	// NextRun is nil for a job on an interval that has not run to its end
	// (ok or failed): serve runs it an interval (Every) after it starts,
	// which only serve knows.
	NextRun *time.Time  `json:"next_run"`
	LastRun *lastJobRun `json:"last_run"`
	// Every is the interval of a job on one (every:), for the table.
	Every time.Duration `json:"-"`
}

// lastJobRun is the last stored run of a job. FinishedAt is nil while it
// is running, and HeartbeatAt is then when it last said it was going on.
type lastJobRun struct {
	StartedAt   time.Time          `json:"started_at"`
	FinishedAt  *time.Time         `json:"finished_at"`
	HeartbeatAt *time.Time         `json:"heartbeat_at,omitempty"`
	Status      string             `json:"status"`
	Counts      backstop.JobCounts `json:"counts"`
	Error       string             `json:"error,omitempty"`
	// Output is the file a backup job's run wrote, or for a backfill job
	// the resources it found done already (bsync.JobRun.Output).
	Output string `json:"output,omitempty"`
	// ProcessGone names the process of a run shown running that is known
	// to be gone (killed on this host): the job's next run closes it as
	// abandoned.
	ProcessGone string `json:"process_gone,omitempty"`
}

func jobRows(ctx context.Context, db *store.DB, s *bsync.Scheduler) ([]jobRow, error) {
	jobs := s.Jobs()
	rows := make([]jobRow, 0, len(jobs))
	for _, j := range jobs {
		row := jobRow{Name: j.Name, Kind: string(j.Kind), Schedule: j.Schedule(), Every: j.Every}
		for _, r := range j.Resources {
			row.Resources = append(row.Resources, string(r))
		}
		last, ok, err := db.LastJobRun(ctx, j.Name)
		if err != nil {
			return nil, err
		}
		var after time.Time
		if ok {
			row.LastRun = &lastJobRun{StartedAt: last.StartedAt, Status: last.Status, Counts: last.Counts, Error: last.Error, Output: last.Output}
			if last.Status == string(bsync.JobRunning) {
				row.LastRun.HeartbeatAt = &last.HeartbeatAt
				if process, gone := store.OwnerGone(last.Owner); gone {
					row.LastRun.ProcessGone = process
				}
			} else {
				row.LastRun.FinishedAt = &last.FinishedAt
			}
			after = last.StartedAt
		}
		if j.Cron == "" && ok && last.Status == string(bsync.JobRunning) && j.Every > 0 {
			// Running: serve's ticks come every interval from its
			// start, and those while it runs are skipped; the next is
			// the first after now (at the earliest: later if the run
			// still goes on then). From the last run that ended, it
			// would read as overdue, now, on every call.
			now := time.Now()
			next := last.StartedAt.Add(j.Every)
			if next.Before(now) {
				next = last.StartedAt.Add(j.Every * (now.Sub(last.StartedAt)/j.Every + 1))
			}
			next = next.UTC() // as every time the JSON gives
			row.NextRun = &next
			rows = append(rows, row)
			continue
		}
		if j.Cron == "" {
			// serve schedules an interval job from the start of its last
			// run that ran to its end (bsync.JobHistory); without one,
			// from its own start, which is not stored anywhere this
			// command can read: Scheduler.NextRun would give now plus
			// the interval, a time that moves with every call.
			_, ran, err := db.LastJobStart(ctx, j.Name)
			if err != nil {
				return nil, err
			}
			if !ran {
				rows = append(rows, row)
				continue
			}
		}
		next, err := s.NextRun(j.Name, after)
		if err != nil {
			return nil, fmt.Errorf("job %s: next run: %w", j.Name, err)
		}
		next = next.UTC() // gocron gives it in the scheduler's location, local
		row.NextRun = &next
		rows = append(rows, row)
	}
	return rows, nil
}

// jobTimeLayout is how the jobs table shows a time: local, with its zone
// (a cron's times are local too, and serve may run elsewhere).
const jobTimeLayout = "2006-01-02 15:04:05 MST"

func printJobs(w io.Writer, rows []jobRow, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, "no jobs configured (add them under jobs: in schedules.yaml)")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tSCHEDULE\tNEXT RUN\tLAST RUN\tRESULT")
	for _, r := range rows {
		lastAt, res := "never", "-"
		if r.LastRun != nil {
			lastAt, res = r.LastRun.StartedAt.Local().Format(jobTimeLayout), resultCell(r.LastRun)
		}
		next := shortDuration(r.Every) + " after serve starts"
		if r.NextRun != nil {
			next = r.NextRun.Local().Format(jobTimeLayout)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, r.Kind, r.Schedule, next, lastAt, res)
	}
	return tw.Flush()
}

// resultWidth is the most characters the RESULT column of backstop jobs
// shows: a failed run's status and the start of its error.
const resultWidth = 64

// resultCell is the RESULT of run in the table: its status, and for a run
// that ended with an error (failed, interrupted, abandoned) the start of
// that error on one line, cut to resultWidth characters with "…". An error
// that starts with the status ("abandoned: no heartbeat since …") is not
// prefixed with it again.
func resultCell(run *lastJobRun) string {
	if run.ProcessGone != "" {
		return fmt.Sprintf("running? its process (%s) is gone", run.ProcessGone)
	}
	if run.Status == string(bsync.JobOK) && strings.HasPrefix(run.Output, bsync.BackfillDone) && run.Counts.Pages == 0 {
		// Every resource was done already (with one that read, the
		// counts tell; the output names those done).
		return run.Status + ": " + bsync.BackfillDone // a backfill job is one pass
	}
	if run.Error == "" || run.Status == string(bsync.JobOK) || run.Status == string(bsync.JobRunning) {
		return run.Status
	}
	msg := strings.Join(strings.FieldsFunc(run.Error, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r)
	}), " ")
	if !strings.HasPrefix(msg, run.Status+":") {
		msg = run.Status + ": " + msg
	}
	if utf8.RuneCountInString(msg) <= resultWidth {
		return msg
	}
	cut := []rune(msg)[:resultWidth-1]
	return strings.TrimRight(string(cut), " ") + "…"
}

// shortDuration formats d as time.Duration does, without zero units at
// its end: 1m, 1h, 1h30m rather than 1m0s, 1h0m0s, 1h30m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
