package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sinks/dashboard"
	"github.com/backstop-sync/backstop/sinks/delivery"
	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/sources/governor"
	"github.com/backstop-sync/backstop/store"
	bsync "github.com/backstop-sync/backstop/sync"
)

// sampleEvery is how often serve samples the quota and intake figures the
// dashboard draws over time (kept bsync.SampleRetention).
const sampleEvery = time.Minute

// ui is the dashboard as serve runs it: the handler under /ui and the
// sampler that records the quota and intake figures it draws.
type ui struct {
	handler http.Handler
	dash    *dashboard.Dashboard // nil when the dashboard is off
	stop    context.CancelFunc
	done    chan struct{}
}

// uiDeps is what the dashboard is built from.
type uiDeps struct {
	a          *app
	sched      *bsync.Scheduler
	dispatcher *delivery.Dispatcher
	intake     *intake.Metrics
	meter      *quotaMeter
}

// startUI builds the dashboard, and starts sampling, when dashboard.token
// is set; otherwise /ui answers 404 saying how to turn it on. Close it
// before the store closes.
func startUI(ctx context.Context, deps uiDeps) (*ui, error) {
	token := deps.a.cfg.Dashboard.Token.Value()
	if token == "" {
		return &ui{handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			intake.WriteError(w, http.StatusNotFound, "dashboard_off",
				"the dashboard is off: set dashboard.token (e.g. token: ${BACKSTOP_DASHBOARD_TOKEN}) and restart serve")
		})}, nil
	}
	log := deps.a.log.With("component", "dashboard")
	d, err := dashboard.New(dashboard.Options{
		Token:   token,
		Backend: &uiBackend{deps: deps, now: time.Now},
		Logger:  deps.a.log, // the dashboard names its component itself
	})
	if err != nil {
		return nil, err
	}
	s := &sampler{db: deps.a.db, gov: deps.a.gov, meter: deps.meter, intake: deps.intake, log: log, now: time.Now}
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	u := &ui{handler: d, dash: d, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(u.done)
		s.run(sctx, sampleEvery)
	}()
	return u, nil
}

// Close stops the job runs started from the dashboard and the sampler,
// which records a last sample.
func (u *ui) Close(ctx context.Context) error {
	if u.dash == nil {
		return nil
	}
	err := u.dash.Close(ctx)
	u.stop()
	<-u.done
	return err
}

// uiBackend is dashboard.Backend over the store, the dispatcher, the
// scheduler and the governor. It never hands the dashboard a secret: target
// URLs are redacted, and API keys appear only as their KeyID.
type uiBackend struct {
	deps uiDeps
	now  func() time.Time
}

var _ dashboard.Backend = (*uiBackend)(nil)

func (b *uiBackend) db() *store.DB { return b.deps.a.db }

func (b *uiBackend) Deliveries(ctx context.Context, f dashboard.DeliveryFilter) ([]delivery.Row, error) {
	return b.db().DeliveryLog(ctx, store.LogFilter{Status: f.Status, Target: f.Target, EventType: f.EventType,
		DeliveredSince: f.DeliveredSince, Limit: f.Limit, Before: f.Before, After: f.After})
}

func (b *uiBackend) Delivery(ctx context.Context, id int64) (delivery.Row, bool, error) {
	return b.db().Delivery(ctx, id)
}

func (b *uiBackend) Attempts(ctx context.Context, id int64) ([]delivery.Attempt, error) {
	return b.db().Attempts(ctx, id)
}

func (b *uiBackend) LastAttempts(ctx context.Context, id int64, n int) ([]delivery.Attempt, int, error) {
	return b.db().LastAttempts(ctx, id, n)
}

// Targets returns the configured targets, then the unconfigured ones that
// have deliveries. Without counts it reads target_state and the names of
// the outbox's targets (one index search each), never every outbox row.
func (b *uiBackend) Targets(ctx context.Context, counts bool) ([]dashboard.Target, error) {
	cfg := b.deps.a.cfg
	names := make([]string, len(cfg.Targets))
	for i, t := range cfg.Targets {
		names[i] = t.Name
	}
	var states, gone []store.TargetState
	var err error
	if counts {
		if states, err = b.db().TargetStates(ctx, names); err != nil {
			return nil, err
		}
		if gone, err = b.db().UnconfiguredTargets(ctx, names); err != nil {
			return nil, err
		}
	} else {
		others, err := b.db().UnconfiguredTargetNames(ctx, names)
		if err != nil {
			return nil, err
		}
		all, err := b.db().TargetSettings(ctx, append(slices.Clip(names), others...))
		if err != nil {
			return nil, err
		}
		states, gone = all[:len(names)], all[len(names):]
	}
	out := make([]dashboard.Target, len(states), len(states)+len(gone))
	for i, s := range states {
		out[i] = dashboard.Target{TargetState: s, URL: backstop.RedactURL(cfg.Targets[i].URL)}
	}
	for _, s := range gone {
		out = append(out, dashboard.Target{TargetState: s, Unconfigured: true})
	}
	return out, nil
}

func (b *uiBackend) Retry(ctx context.Context, seen delivery.Row) (bool, error) {
	done, err := b.db().RetryDeliveryAsSeen(ctx, seen.ID, seen.Status, seen.UpdatedAt, b.now())
	if done {
		b.deps.dispatcher.Wake(seen.Target)
	}
	return done, err
}

func (b *uiBackend) RetryDead(ctx context.Context, target string, shown time.Time) (int64, error) {
	n, err := b.db().RetryDeadAsOf(ctx, target, shown, b.now())
	if n > 0 {
		b.deps.dispatcher.Wake(target)
	}
	return n, err
}

func (b *uiBackend) Redirect(ctx context.Context, row delivery.Row, rawURL string) (delivery.Attempt, error) {
	return b.deps.dispatcher.Redirect(ctx, row, rawURL)
}

func (b *uiBackend) Jobs(ctx context.Context, runs int) ([]dashboard.Job, error) {
	jobs := b.deps.sched.Jobs()
	out := make([]dashboard.Job, 0, len(jobs))
	for _, j := range jobs {
		v := dashboard.Job{Name: j.Name, Kind: string(j.Kind), Schedule: j.Schedule()}
		for _, r := range j.Resources {
			v.Resources = append(v.Resources, string(r))
		}
		var after time.Time
		if runs > 0 {
			stored, err := b.db().JobRuns(ctx, j.Name, runs)
			if err != nil {
				return nil, err
			}
			if stored, err = b.withLastRan(ctx, j.Name, stored, runs); err != nil {
				return nil, err
			}
			ranSeen := false
			for _, r := range stored {
				run := dashboard.JobRun{StartedAt: r.StartedAt, FinishedAt: r.FinishedAt,
					Status: r.Status, Counts: r.Counts, Error: r.Error, Output: r.Output, HeartbeatAt: r.HeartbeatAt}
				if r.Status == string(bsync.JobRunning) {
					run.ProcessGone, run.Stale = runGone(r, b.now())
				}
				v.Runs = append(v.Runs, run)
				if !ranSeen && r.Status != string(bsync.JobSkipped) {
					// The newest run that ran is still running (a
					// scheduled one, say): the page shows it so.
					ranSeen, v.Running = true, liveRun(r, b.now())
				}
			}
			if len(stored) > 0 {
				after = stored[0].StartedAt
			}
		}
		next, err := b.deps.sched.NextRun(j.Name, after)
		if err != nil {
			return nil, fmt.Errorf("job %s: next run: %w", j.Name, err)
		}
		v.NextRun = next
		out = append(out, v)
	}
	return out, nil
}

// withLastRan returns stored, the newest runs of job (at most limit), with
// the newest run that did run added last when none of them did: a job
// longer than its interval stores a skipped run at every tick while it
// runs, so the run that says how the job is doing (running, or how it
// ended) can be older than every run listed. It is the run backstop jobs
// shows (store.LastJobRun).
func (b *uiBackend) withLastRan(ctx context.Context, job string, stored []store.JobRun, limit int) ([]store.JobRun, error) {
	ran := func(r store.JobRun) bool { return r.Status != string(bsync.JobSkipped) }
	if len(stored) < limit || slices.ContainsFunc(stored, ran) {
		return stored, nil // every run is listed, or one that ran is
	}
	last, ok, err := b.db().LastJobRun(ctx, job)
	if err != nil {
		return nil, fmt.Errorf("job %s: last run: %w", job, err)
	}
	if !ok || !ran(last) {
		return stored, nil
	}
	return append(stored, last), nil
}

// liveRun reports whether r is a run going on at now: stored as running,
// beating, and not of a process known to be gone. A run whose process died
// (SIGKILL) stays "running" in the store until its job's next run closes
// it as abandoned (at once when its process is known gone on this host),
// or maintenance does an hour after its last heartbeat; it neither shows
// as running nor holds Run now back once its process is known gone or
// three heartbeats are missed.
func liveRun(r store.JobRun, now time.Time) bool {
	if r.Status != string(bsync.JobRunning) {
		return false
	}
	_, gone := runGone(r, now)
	return !gone
}

// runGone reports whether r, stored as running, is not going on at now:
// its process is known to be gone (process names it, as store.OwnerGone
// does) or it has missed three heartbeats.
func runGone(r store.JobRun, now time.Time) (process string, gone bool) {
	if process, gone := store.OwnerGone(r.Owner); gone {
		return process, true
	}
	return "", now.Sub(r.HeartbeatAt) >= 3*bsync.DefaultJobHeartbeat
}

// RunJob runs job name through the scheduler, which refuses it
// (ErrJobRunning) while the job runs already, scheduled or in another
// process; started is called once the run is past that check and stored
// as running, as its work begins, and waiting when its lock in Redis,
// taken, makes it wait first (see bsync.WithLockWait).
func (b *uiBackend) RunJob(ctx context.Context, name string, started func(), waiting func(time.Duration)) error {
	// A run going on in another process (backstop run from system cron)
	// holds no lock this scheduler sees without governor.redis: its
	// stored row, alive, refuses the press.
	if last, ok, err := b.db().LastJobRun(ctx, name); err != nil {
		return fmt.Errorf("job %s: last run: %w", name, err)
	} else if ok && liveRun(last, b.now()) {
		return fmt.Errorf("%w: job %s: %w (run %d, started %s)", dashboard.ErrJobRunning, name, bsync.ErrJobRunning,
			last.ID, last.StartedAt.UTC().Format(time.RFC3339))
	}
	if waiting != nil {
		ctx = bsync.WithLockWait(ctx, waiting)
	}
	_, err := b.deps.sched.RunJobNotify(ctx, name, started)
	switch {
	case errors.Is(err, bsync.ErrUnknownJob):
		return fmt.Errorf("%w %q", dashboard.ErrUnknownJob, name)
	case errors.Is(err, bsync.ErrJobRunning):
		return fmt.Errorf("%w: %w", dashboard.ErrJobRunning, err)
	}
	return err
}

func (b *uiBackend) ReconcileRuns(ctx context.Context, limit int) ([]dashboard.ReconcileRun, error) {
	runs, err := b.db().ReconcileRuns(ctx, limit)
	if err != nil {
		return nil, err
	}
	out := make([]dashboard.ReconcileRun, len(runs))
	for i, r := range runs {
		out[i] = dashboard.ReconcileRun(r)
	}
	return out, nil
}

// RevokeSession remembers a signed-out dashboard session in the store.
func (b *uiBackend) RevokeSession(ctx context.Context, id string, expires time.Time) error {
	return b.db().RevokeSession(ctx, id, expires)
}

// SessionRevoked reports whether a dashboard session was signed out.
func (b *uiBackend) SessionRevoked(ctx context.Context, id string) (bool, error) {
	return b.db().SessionRevoked(ctx, id)
}

// JobsLeader reports the jobs lease of this process (governor.redis).
func (b *uiBackend) JobsLeader() dashboard.JobsLeader {
	if l := b.deps.a.lease; l != nil {
		return dashboard.JobsLeader{Elected: true, Leader: l.Leader()}
	}
	return dashboard.JobsLeader{}
}

func (b *uiBackend) Cursors(ctx context.Context) ([]backstop.Cursor, error) {
	return b.db().Cursors(ctx)
}

// Quota returns the budget of the process's key live, and the last sample
// of any other key the store has samples of (from an earlier key).
func (b *uiBackend) Quota(ctx context.Context, since time.Time) ([]dashboard.KeyQuota, error) {
	gov := b.deps.a.gov
	st, err := gov.State(ctx)
	if err != nil {
		return nil, err
	}
	live := dashboard.KeyQuota{KeyID: gov.KeyID(), Live: true, Learned: st.Learned, Limit: st.Limit,
		Remaining: st.Remaining, Reset: st.Reset, Window: st.Window, InFlight: st.InFlight, PausedUntil: st.PausedUntil}
	samples, err := b.db().QuotaSamples(ctx, since)
	if err != nil {
		return nil, err
	}
	out := []dashboard.KeyQuota{live}
	index := map[string]int{live.KeyID: 0}
	for _, s := range samples {
		i, ok := index[s.KeyID]
		if !ok {
			i = len(out)
			index[s.KeyID] = i
			out = append(out, dashboard.KeyQuota{KeyID: s.KeyID})
		}
		k := &out[i]
		if !k.Live {
			k.Limit, k.Remaining, k.Reset, k.PausedUntil = s.Limit, s.Remaining, s.Reset, s.PausedUntil
		}
		k.Samples = append(k.Samples, dashboard.QuotaSample(s))
	}
	return out, nil
}

func (b *uiBackend) Intake(ctx context.Context, since time.Time, period time.Duration) (dashboard.IntakeStats, error) {
	counts, err := b.db().ProcessedByPeriod(ctx, since, period)
	if err != nil {
		return dashboard.IntakeStats{}, err
	}
	samples, err := b.db().IntakeSamples(ctx, since)
	if err != nil {
		return dashboard.IntakeStats{}, err
	}
	st := dashboard.IntakeStats{
		Duplicates:        int(counterValue(b.deps.intake.Duplicates)),
		SignatureFailures: int(counterValue(b.deps.intake.SignatureFailures)),
	}
	for _, c := range counts {
		st.ByOrigin = append(st.ByOrigin, dashboard.OriginCount(c))
	}
	for _, s := range samples {
		st.Samples = append(st.Samples, dashboard.IntakeSample(s))
	}
	return st, nil
}

// counterValue reads a Prometheus counter.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if c == nil || c.Write(&m) != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

// sampler records, every period, the governor's budget with the meter's
// counts since the previous sample, and the intake's duplicates and
// signature failures since the previous sample; it prunes samples older
// than bsync.SampleRetention.
type sampler struct {
	db     *store.DB
	gov    *governor.Governor
	meter  *quotaMeter
	intake *intake.Metrics
	log    *slog.Logger
	now    func() time.Time

	dups, badSigs float64
}

// run samples every period until ctx ends, then once more.
func (s *sampler) run(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.sample(context.WithoutCancel(ctx))
			return
		case <-t.C:
			s.sample(ctx)
		}
	}
}

// sample records one sample of each kind; errors are logged (a lost
// sample is a gap in a chart, not a reason to stop serving).
func (s *sampler) sample(ctx context.Context) {
	now := s.now()
	st, err := s.gov.State(ctx)
	if err != nil {
		s.log.Warn("quota sample: governor state", "err", err)
		return
	}
	if err := saveQuotaSample(ctx, s.db, s.gov, s.meter, now, st); err != nil {
		s.log.Warn("quota sample", "err", err)
	}
	dups, bad := counterValue(s.intake.Duplicates), counterValue(s.intake.SignatureFailures)
	in := store.IntakeSample{At: now, Duplicates: int(dups - s.dups), SignatureFailures: int(bad - s.badSigs)}
	if err := s.db.SaveIntakeSample(ctx, in); err != nil {
		s.log.Warn("intake sample", "err", err)
	} else {
		s.dups, s.badSigs = dups, bad
	}
	if _, err := s.db.PruneSamples(ctx, now.Add(-bsync.SampleRetention)); err != nil {
		s.log.Warn("prune samples", "err", err)
	}
	if _, err := s.db.PruneRevokedSessions(ctx, now); err != nil {
		s.log.Warn("prune revoked sessions", "err", err)
	}
}
