package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/cmd/backstop/config"
	bsync "github.com/backstop-sync/backstop/sync"
)

func (m *Main) runCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "run JOB",
		Short: "Run one configured job now (for system cron) and print its counts",
		Long: `run runs the job named JOB from schedules.yaml (jobs:) once, now, whatever its
schedule, stores the run like backstop serve does, and prints its counts. It is
for people who schedule with system cron instead of backstop serve.

A sync, backfill or reconcile job shows its progress as those commands do:
a bar per resource on a terminal, otherwise a progress line per resource
every 5 seconds and a line when each ends. A backup job prints the file it
wrote and how many of its older backups it deleted.

The run's result is ok, failed, interrupted (Ctrl-C or SIGTERM: a sync
finishes its current page first, and what was committed is kept) or skipped
(the job was running already in another process), as backstop jobs and the
dashboard show it; a skipped run's error names the run that holds the job.

Exit codes: 0 the run succeeded; 1 it failed; 2 unknown job or bad
configuration; 75 skipped, not run, because the job was running already in
another process (on the same store, or with governor.redis anywhere): try
again later; 130 interrupted.`,
		Example: "  backstop run crm-nightly\n  backstop run payments-hourly --json",
		Args:    oneArg("the job's name in schedules.yaml (see backstop jobs)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			prog, local, err := m.jobProgress(g, args[0])
			if err != nil {
				return err
			}
			logw := m.Stderr
			if prog != nil {
				logw = prog.out
			}
			open := m.openApp
			if local {
				open = m.openMaintenanceApp
			}
			a, err := open(ctx, g, logw)
			if err != nil {
				prog.abortIfAny()
				return err
			}
			defer a.Close()
			s, err := a.scheduler()
			if err != nil {
				prog.abortIfAny()
				return err
			}
			defer s.Stop()
			// A sync or backfill job's pages are refused once its cursor
			// is reset meanwhile (backstop cursors reset), instead of
			// saving over the reset.
			a.engine.EmitGuard = a.db
			if prog != nil {
				prog.start(a.log)
				a.engine.OnPage, a.engine.OnDone = prog.page, prog.finish
				a.engine.OnReconcilePage, a.engine.OnReconcileDone = prog.reconcilePage, prog.reconcileFinish
			}
			// A lock new to Redis is waited for before the run begins
			// (RedisJobLocks.fence): the progress says so, and so does
			// the run's summary, whose duration is the run's alone.
			var waitFrom time.Time
			ctx = bsync.WithLockWait(ctx, func(wait time.Duration) {
				waitFrom = time.Now()
				prog.lockWait(wait)
			})
			run, runErr := s.RunJob(ctx, args[0])
			var lockWait time.Duration
			if !waitFrom.IsZero() {
				end := time.Now() // stopped while it waited
				if run.Locked {
					end = run.StartedAt
				}
				lockWait = max(end.Sub(waitFrom), time.Millisecond)
			}
			if prog != nil {
				prog.wait()
				// The bars are gone, and with them what was written
				// through them: what is logged from now on (a skipped
				// run's reason, the app's last words) goes to stderr.
				if log, err := g.newLogger(m.Stderr); err == nil {
					a.log = log
				}
			}
			if errors.Is(runErr, bsync.ErrUnknownJob) {
				return usagef("run %s: no such job in %s (see backstop jobs)", args[0], m.configName(g))
			}
			if err := printJobRun(m.Stdout, run, lockWait, asJSON); err != nil {
				return err
			}
			if errors.Is(runErr, bsync.ErrJobRunning) {
				// Not run: a cron wrapper that alerts on failures, or
				// one that chains the next step, must not take it for
				// run; not a failure either (exit 75, try again later).
				return busyError{fmt.Errorf("run %s: skipped: %w", args[0], runErr)}
			}
			return withCursorHint(cmd, runErr, jobStartOver(s, args[0]))
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the run as JSON")
	return cmd
}

// jobProgress returns the progress display of the configured job named
// name when it reads the platform's feeds (sync, backfill, reconcile), or
// nil: for a maintenance or backup job, or a name not configured (RunJob
// then says so). local is true for a maintenance or backup job, which
// needs no platform (openMaintenanceApp). The configuration is read as local
// commands read it (the platform's address and key may be missing: the
// app of a job that needs them says so); it fails as that does.
func (m *Main) jobProgress(g *globals, name string) (_ *progress, local bool, _ error) {
	cfg, err := m.loadConfig(g, true)
	if err != nil {
		return nil, false, err
	}
	for _, j := range cfg.Jobs {
		if j.Name != name {
			continue
		}
		switch bsync.JobKind(j.Kind) {
		case bsync.JobSync, bsync.JobBackfill, bsync.JobReconcile:
			resources := j.Resources
			if len(resources) == 0 {
				resources = backstop.Resources
			}
			// The scheduler runs a job's resources in order (bsync
			// Scheduler.work).
			return newProgress(m, j.Kind, resources).sequential(resources), false, nil
		case bsync.JobMaintenance, bsync.JobBackup:
			return nil, true, nil
		}
		return nil, false, nil
	}
	// Said before anything else is asked of the configuration (the API
	// key, which a maintenance job does not need, say).
	return nil, false, m.unknownJob(g, cfg, name)
}

// unknownJob is run's error for a job name cfg does not have, naming the
// one it may be a typo of.
func (m *Main) unknownJob(g *globals, cfg *config.Config, name string) error {
	names := make([]string, len(cfg.Jobs))
	for i, j := range cfg.Jobs {
		names[i] = j.Name
	}
	hint := ""
	if s := config.Suggest(name, names); s != "" {
		hint = ": did you mean " + s + "?"
	}
	return usagef("run %s: no such job in %s%s (see backstop jobs)", name, m.configName(g), hint)
}

// openMaintenanceApp opens what a maintenance or backup job needs: the store, read
// as local commands read the configuration (it never calls the platform,
// so source.api_key may be unset), and, with governor.redis, Redis for the
// job's lock, so that it does not run beside serve's run of it. Redis
// unreachable is an error, as for every command that uses it (exit 2).
//
// Neither job fills the store, so, as for backstop backup, a store.path with
// no database (a typo) is refused instead of created empty: a backup job
// would otherwise write copies of that empty store and prune the good ones.
func (m *Main) openMaintenanceApp(ctx context.Context, g *globals, logw io.Writer) (*app, error) {
	g.readsStore = true
	a, err := m.openAppLocal(ctx, g, logw)
	if err != nil {
		return nil, err
	}
	if addr := a.cfg.Governor.Redis; addr != "" {
		if a.rdb, err = connectRedis(ctx, addr.Value()); err != nil {
			a.Close()
			return nil, usageError{err}
		}
	}
	return a, nil
}

// jobStartOver is withCursorHint's startOver for the job named name: a sync
// job's cursor is reset, a backfill job's checkpoint is read again with
// backfill --restart; nil for the other kinds, which save no cursor.
func jobStartOver(s *bsync.Scheduler, name string) func(backstop.Resource) string {
	for _, j := range s.Jobs() {
		if j.Name != name {
			continue
		}
		switch j.Kind {
		case bsync.JobSync:
			return resetHint
		case bsync.JobBackfill:
			return restartHint(j.Emit, false)
		}
	}
	return nil
}

// printJobRun prints run, which waited lockWait for its job's lock
// before it began, or before it stopped when run.Locked is false (0: it
// did not wait).
func printJobRun(w io.Writer, run bsync.JobRun, lockWait time.Duration, asJSON bool) error {
	if asJSON {
		out := struct {
			ID         int64              `json:"id"`
			Job        string             `json:"job"`
			Kind       string             `json:"kind"`
			StartedAt  time.Time          `json:"started_at"`
			FinishedAt time.Time          `json:"finished_at"`
			Status     string             `json:"status"`
			Counts     backstop.JobCounts `json:"counts"`
			Error      string             `json:"error,omitempty"`
			Output     string             `json:"output,omitempty"`
			// LockWait is how long the run waited for its job's lock
			// before started_at, in seconds (a lock new to Redis).
			LockWait float64 `json:"lock_wait_seconds,omitempty"`
		}{ID: run.ID, Job: run.Job, Kind: string(run.Kind), StartedAt: run.StartedAt, FinishedAt: run.FinishedAt,
			Status: string(run.Status), Counts: run.Counts, Output: run.Output, LockWait: lockWait.Seconds()}
		if run.Err != nil {
			out.Error = run.Err.Error()
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	c := run.Counts
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "job\t%s (%s)\n", run.Job, run.Kind)
	if run.ID > 0 { // the stored run's id; 0 when it could not be stored
		fmt.Fprintf(tw, "run\t%d\n", run.ID)
	}
	fmt.Fprintf(tw, "result\t%s\n", run.Status)
	fmt.Fprintf(tw, "duration\t%s\n", round(run.FinishedAt.Sub(run.StartedAt)))
	switch {
	case lockWait > 0 && run.Locked:
		fmt.Fprintf(tw, "lock wait\t%s before the run began (its lock was new to Redis: its first use there, or Redis lost its data)\n", round(lockWait))
	case lockWait > 0:
		fmt.Fprintf(tw, "lock wait\t%s, and the run stopped before it began (its lock was new to Redis: its first use there, or Redis lost its data)\n", round(lockWait))
	}
	switch run.Kind {
	case bsync.JobMaintenance:
		fmt.Fprintf(tw, "pruned\t%d\n", c.Pruned)
	case bsync.JobBackup:
		if run.Output != "" {
			fmt.Fprintf(tw, "backup\t%s\n", run.Output)
		}
		if run.Err == nil || c.Pruned > 0 { // a run that failed before pruning deleted none, as the error says
			fmt.Fprintf(tw, "deleted\t%d older backups\n", c.Pruned)
		}
	case bsync.JobReconcile:
		fmt.Fprintf(tw, "pages\t%d\nscanned\t%d\nmissing\t%d\nbehind\t%d\n", c.Pages, c.Objects, c.Missing, c.Behind)
		if c.Orphans != nil { // a full reconcile's
			fmt.Fprintf(tw, "orphans\t%d\n", *c.Orphans)
		}
	default:
		if run.Output != "" { // a backfill job's resources done already
			fmt.Fprintf(tw, "note\t%s\n", run.Output)
		}
		fmt.Fprintf(tw, "pages\t%d\nobjects\t%d\nnew\t%d\nupdated\t%d\n", c.Pages, c.Objects, c.New, c.Updated)
	}
	if run.Kind != bsync.JobMaintenance && run.Kind != bsync.JobBackup {
		// Reconcile re-emits what was missed; sync and backfill emit what
		// they read that is new or newer (one count, Reemitted, for both).
		emitted := "emitted"
		if run.Kind == bsync.JobReconcile {
			emitted = "re-emitted"
		}
		fmt.Fprintf(tw, "%s\t%d\nsuppressed\t%d\nrequests\t%d\n429s\t%d\n",
			emitted, c.Reemitted, c.Suppressed, c.Requests, c.RateLimited)
	}
	return tw.Flush()
}
