package sync_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/internal/syncbuf"
	"github.com/backstop-sync/backstop/store"
	bsync "github.com/backstop-sync/backstop/sync"
)

// jobStore adapts store.DB to bsync.JobStore, as cmd/backstop does.
type jobStore struct{ *store.DB }

func (s jobStore) SaveJobRun(ctx context.Context, run bsync.JobRun) (int64, error) {
	r := store.JobRun{Job: run.Job, Kind: string(run.Kind), StartedAt: run.StartedAt, FinishedAt: run.FinishedAt,
		Status: string(run.Status), Counts: run.Counts}
	if run.Err != nil {
		r.Error = run.Err.Error()
	}
	return s.DB.SaveJobRun(ctx, r)
}

func (s jobStore) StartJobRun(ctx context.Context, run bsync.JobRun) (int64, error) {
	return s.DB.StartJobRun(ctx, store.JobRun{Job: run.Job, Kind: string(run.Kind), StartedAt: run.StartedAt})
}

func (s jobStore) FinishJobRun(ctx context.Context, run bsync.JobRun) error {
	r := store.JobRun{ID: run.ID, Job: run.Job, Kind: string(run.Kind), StartedAt: run.StartedAt, FinishedAt: run.FinishedAt,
		Status: string(run.Status), Counts: run.Counts}
	if run.Err != nil {
		r.Error = run.Err.Error()
	}
	return s.DB.FinishJobRun(ctx, r)
}

// funcSource is a backstop.Source whose List is ListFunc.
type funcSource struct {
	ListFunc func(ctx context.Context, req backstop.ListRequest) (backstop.Page, error)
}

func (f funcSource) List(ctx context.Context, req backstop.ListRequest) (backstop.Page, error) {
	return f.ListFunc(ctx, req)
}

func (funcSource) Get(context.Context, backstop.Resource, string) (backstop.Object, backstop.Cost, error) {
	return backstop.Object{}, backstop.Cost{}, errors.New("not used")
}

func openStore(t *testing.T) *store.DB {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "j.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		}
	}
}

// A job whose run takes longer than its interval never runs twice at once:
// the scheduled runs that come meanwhile are skipped, counted and stored.
func TestJobLongerThanIntervalNeverOverlaps(t *testing.T) {
	db := openStore(t)
	var warnings syncbuf.Buffer
	var running, maxRunning, calls atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{}, 100)
	src := funcSource{ListFunc: func(ctx context.Context, req backstop.ListRequest) (backstop.Page, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			m := maxRunning.Load()
			if n <= m || maxRunning.CompareAndSwap(m, n) {
				break
			}
		}
		calls.Add(1)
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return backstop.Page{}, ctx.Err()
		}
		return backstop.Page{NextCursor: "c1", Cost: backstop.Cost{Requests: 1}}, nil
	}}
	s, err := bsync.NewScheduler([]bsync.Job{{
		Name: "slow", Kind: bsync.JobSync, Resources: []backstop.Resource{backstop.Contacts}, Every: 100 * time.Millisecond,
	}}, bsync.SchedulerOptions{
		Engine: &bsync.Engine{Source: src, Mirror: db},
		Store:  jobStore{db},
		Logger: slog.New(slog.NewTextHandler(&warnings, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	stopped := false
	defer func() {
		if !stopped {
			s.Stop()
		}
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the job never started")
	}
	// Three intervals pass while the first run is blocked.
	waitFor(t, "three skipped runs", func() bool { return s.Skipped("slow") >= 3 })
	if run, err := s.RunJob(t.Context(), "slow"); !errors.Is(err, bsync.ErrJobRunning) || run.Status != bsync.JobSkipped || run.ID == 0 {
		t.Errorf("RunJob while running: %+v, err = %v; want a stored skipped run (its id) and ErrJobRunning", run, err)
	}
	close(release)
	waitFor(t, "a finished run", func() bool {
		runs, err := db.JobRuns(t.Context(), "slow", 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range runs {
			if r.Status == "ok" {
				return true
			}
		}
		return false
	})
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if got := maxRunning.Load(); got != 1 {
		t.Errorf("at most %d runs at once, want 1", got)
	}
	runs, err := db.JobRuns(t.Context(), "slow", 0)
	if err != nil {
		t.Fatal(err)
	}
	var skipped int
	for _, r := range runs {
		if r.Status == "skipped" {
			skipped++
		}
	}
	if skipped < 3 {
		t.Errorf("%d skipped runs stored, want at least 3 (counted %d)", skipped, s.Skipped("slow"))
	}
	// Only the first tick skipped during the run is a warning.
	if n := strings.Count(warnings.String(), "run skipped"); n != 1 {
		t.Errorf("%d warnings of skipped runs during one run, want 1:\n%s", n, warnings.String())
	}
}

// RunJob runs a job now and stores the run with its counts; a sync job
// emits its changes with origin sync, queued to the matching targets.
func TestRunJobSyncStoresRunAndEmits(t *testing.T) {
	w := newWorld(t, 30)
	ctx := t.Context()
	routes := []backstop.Route{{Target: "crm", Events: []string{"contact.*"}}, {Target: "pay", Events: []string{"payment.*"}}}
	s, err := bsync.NewScheduler([]bsync.Job{
		{Name: "crm-nightly", Kind: bsync.JobSync, Resources: []backstop.Resource{backstop.Contacts}, Cron: "0 3 * * *"},
	}, bsync.SchedulerOptions{Engine: w.engine, Store: jobStore{w.db}, Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	run, err := s.RunJob(ctx, "crm-nightly")
	if err != nil {
		t.Fatal(err)
	}
	want := len(w.sim.Objects(backstop.Contacts))
	if run.Status != bsync.JobOK || run.Counts.New != want || run.Counts.Reemitted != want || run.ID == 0 {
		t.Fatalf("run = %+v, want ok with %d new and re-emitted", run, want)
	}
	stored, ok, err := w.db.LastJobRun(ctx, "crm-nightly")
	if err != nil || !ok {
		t.Fatalf("last run: ok=%v err=%v", ok, err)
	}
	if stored.ID != run.ID || stored.Status != "ok" || stored.Counts.New != want || stored.Kind != "sync" {
		t.Errorf("stored run = %+v", stored)
	}
	for _, o := range w.sim.Objects(backstop.Contacts) {
		id := backstop.EventID(backstop.DedupKey(backstop.Contacts, o.ID, o.UpdatedAt))
		pe, ok, err := w.db.ProcessedEvent(ctx, id)
		if err != nil || !ok {
			t.Fatalf("%s: processed event ok=%v err=%v", o.ID, ok, err)
		}
		if pe.Origin != backstop.OriginSync || pe.Type != "contact.created" {
			t.Errorf("%s: processed as %s/%s, want sync/contact.created", o.ID, pe.Origin, pe.Type)
		}
	}
	crm, err := w.db.OutboxRows(ctx, "crm")
	if err != nil {
		t.Fatal(err)
	}
	pay, err := w.db.OutboxRows(ctx, "pay")
	if err != nil {
		t.Fatal(err)
	}
	if len(crm) != want || len(pay) != 0 {
		t.Errorf("outbox: crm %d pay %d, want %d and 0", len(crm), len(pay), want)
	}
	if n, _ := w.db.Count(ctx, backstop.Contacts); n != want {
		t.Errorf("mirror holds %d contacts, want %d", n, want)
	}
	c := w.cursor(t, backstop.Contacts, backstop.CursorSync)
	if c.Position != lastPosition(w.sim, backstop.Contacts) {
		t.Errorf("cursor at %v, want the end of the feed", c.Position)
	}

	// A second run finds nothing new and emits nothing.
	run, err = s.RunJob(ctx, "crm-nightly")
	if err != nil {
		t.Fatal(err)
	}
	if run.Counts.New+run.Counts.Updated+run.Counts.Reemitted != 0 {
		t.Errorf("second run counts %+v, want nothing new", run.Counts)
	}
	if crm, _ = w.db.OutboxRows(ctx, "crm"); len(crm) != want {
		t.Errorf("outbox after second run: %d rows, want %d", len(crm), want)
	}

	if _, err := s.RunJob(ctx, "nope"); !errors.Is(err, bsync.ErrUnknownJob) {
		t.Errorf("unknown job: err = %v", err)
	}
}

// A maintenance job prunes processed events and job runs past the
// retention, and the delivery log (delivered rows and their attempts)
// past AttemptRetention.
func TestMaintenanceJobPrunes(t *testing.T) {
	db := openStore(t)
	ctx := t.Context()
	now := time.Now()
	old := now.Add(-40 * 24 * time.Hour)
	if _, err := db.SaveJobRun(ctx, store.JobRun{Job: "x", Kind: "sync", StartedAt: old, FinishedAt: old, Status: "ok"}); err != nil {
		t.Fatal(err)
	}
	delivered := func(eventID string, at time.Time) int64 {
		t.Helper()
		id, err := db.Enqueue(ctx, "crm", eventID, "contact.created", json.RawMessage(`{}`), at)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.RecordAttempt(ctx, store.Attempt{DeliveryID: id, Target: "crm", URL: "https://crm.example.com", Attempt: 1, StatusCode: 200, At: at},
			store.Outcome{Status: store.StatusDelivered}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	oldDelivery := delivered("evt_old", now.Add(-bsync.AttemptRetention-time.Hour))
	newDelivery := delivered("evt_new", now.Add(-bsync.AttemptRetention+time.Hour))
	s, err := bsync.NewScheduler([]bsync.Job{{Name: "prune", Kind: bsync.JobMaintenance, Cron: "30 4 * * *"}},
		bsync.SchedulerOptions{Engine: &bsync.Engine{Mirror: db}, Store: jobStore{db}})
	if err != nil {
		t.Fatal(err)
	}
	run, err := s.RunJob(ctx, "prune")
	if err != nil || run.Status != bsync.JobOK || run.Counts.Pruned != 2 {
		t.Fatalf("run = %+v, err = %v; want ok with 2 pruned (the job run, the old delivery)", run, err)
	}
	if runs, err := db.JobRuns(ctx, "x", 0); err != nil {
		t.Fatal(err)
	} else if len(runs) != 0 {
		t.Errorf("old job run kept: %+v", runs)
	}
	if _, ok, err := db.Delivery(ctx, oldDelivery); err != nil {
		t.Fatal(err)
	} else if ok {
		t.Error("a delivery delivered before the retention was kept")
	}
	if _, ok, _ := db.Delivery(ctx, newDelivery); !ok {
		t.Error("a delivery delivered within the retention was pruned")
	}
	if atts, err := db.Attempts(ctx, newDelivery); err != nil || len(atts) != 1 {
		t.Errorf("the kept delivery has %d attempts (%v), want 1", len(atts), err)
	}
}

// Maintenance also prunes the dashboard's quota and intake samples older
// than SampleRetention and the revoked sessions that expired: samples are
// written by cron runs too, and only serve's dashboard pruned them. The
// job's log line gives its duration as a string, not nanoseconds.
func TestMaintenanceJobPrunesDashboardSamples(t *testing.T) {
	db := openStore(t)
	ctx := t.Context()
	now := time.Now()
	const retention = 14 * 24 * time.Hour // SampleRetention, the dashboard's
	old, recent := now.Add(-retention-time.Hour), now.Add(-retention+time.Hour)
	for _, at := range []time.Time{old, recent} {
		if err := db.SaveQuotaSample(ctx, store.QuotaSample{KeyID: "k1", At: at, Limit: 100, Remaining: 50}); err != nil {
			t.Fatal(err)
		}
		if err := db.SaveIntakeSample(ctx, store.IntakeSample{At: at, Duplicates: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.RevokeSession(ctx, "expired", now.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := db.RevokeSession(ctx, "live", now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	s, err := bsync.NewScheduler([]bsync.Job{{Name: "prune", Kind: bsync.JobMaintenance, Cron: "30 4 * * *"}},
		bsync.SchedulerOptions{Engine: &bsync.Engine{Mirror: db}, Store: jobStore{db},
			Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	run, err := s.RunJob(ctx, "prune")
	if err != nil || run.Status != bsync.JobOK || run.Counts.Pruned != 3 {
		t.Fatalf("run = %+v, err = %v; want ok with 3 pruned (a quota sample, an intake sample, a revoked session)", run, err)
	}
	if qs, err := db.QuotaSamples(ctx, time.Time{}); err != nil || len(qs) != 1 {
		t.Errorf("quota samples left: %+v (%v), want the recent one", qs, err)
	}
	if is, err := db.IntakeSamples(ctx, time.Time{}); err != nil || len(is) != 1 {
		t.Errorf("intake samples left: %+v (%v), want the recent one", is, err)
	}
	if ok, err := db.SessionRevoked(ctx, "expired"); err != nil {
		t.Fatal(err)
	} else if ok {
		t.Error("an expired revoked session was kept")
	}
	if ok, _ := db.SessionRevoked(ctx, "live"); !ok {
		t.Error("a revoked session not yet expired was pruned")
	}
	var finished map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "job finished" {
			finished = m
		}
	}
	d, ok := finished["duration"].(string)
	if !ok {
		t.Fatalf("job finished: duration %#v, want a string such as 12ms:\n%s", finished["duration"], logs.String())
	}
	if _, err := time.ParseDuration(d); err != nil {
		t.Errorf("job finished: duration %q: %v", d, err)
	}
}

// NewScheduler rejects jobs it could not schedule.
func TestNewSchedulerRejectsBadJobs(t *testing.T) {
	db := openStore(t)
	for _, j := range []bsync.Job{
		{Name: "", Kind: bsync.JobSync, Every: time.Hour},
		{Name: "a", Kind: "other", Every: time.Hour},
		{Name: "a", Kind: bsync.JobSync},
		{Name: "a", Kind: bsync.JobSync, Every: time.Hour, Cron: "* * * * *"},
		{Name: "a", Kind: bsync.JobSync, Cron: "61 * * * *"},
		{Name: "a", Kind: bsync.JobSync, Every: time.Hour, Resources: []backstop.Resource{"widgets"}},
	} {
		if _, err := bsync.NewScheduler([]bsync.Job{j}, bsync.SchedulerOptions{Engine: &bsync.Engine{}, Store: jobStore{db}}); !errors.Is(err, bsync.ErrInvalidJob) {
			t.Errorf("%+v: err = %v, want ErrInvalidJob", j, err)
		}
	}
}

// NextRun before Start follows the schedule.
func TestNextRunBeforeStart(t *testing.T) {
	db := openStore(t)
	now := time.Date(2026, 1, 2, 10, 15, 0, 0, time.UTC)
	s, err := bsync.NewScheduler([]bsync.Job{
		{Name: "nightly", Kind: bsync.JobSync, Cron: "0 3 * * *"},
		{Name: "often", Kind: bsync.JobSync, Every: 10 * time.Minute},
	}, bsync.SchedulerOptions{Engine: &bsync.Engine{}, Store: jobStore{db}, Location: time.UTC,
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		job  string
		want time.Time
	}{
		{"nightly", time.Date(2026, 1, 3, 3, 0, 0, 0, time.UTC)},
		{"often", now.Add(10 * time.Minute)},
	} {
		got, err := s.NextRun(tc.job, time.Time{})
		if err != nil || !got.Equal(tc.want) {
			t.Errorf("%s: next run %v, %v; want %v", tc.job, got, err, tc.want)
		}
	}
}

// losingLocker grants every lock, and cancels the run's context with
// ErrJobLockLost once lose is closed, as RedisJobLocks does when it cannot
// renew the lock.
type losingLocker struct{ lose chan struct{} }

func (l losingLocker) LockJob(ctx context.Context, _ string) (context.Context, func(), error) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-l.lose:
			cancel(bsync.ErrJobLockLost)
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(context.Canceled) }, nil
}

// A run stopped because its lock was lost is interrupted, and its error
// (returned and stored) says the lock was lost, once, rather than a bare
// "context canceled" twice.
func TestRunStoppedByALostLockSaysSo(t *testing.T) {
	db := openStore(t)
	started := make(chan struct{}, 1)
	src := funcSource{ListFunc: func(ctx context.Context, req backstop.ListRequest) (backstop.Page, error) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return backstop.Page{}, ctx.Err()
	}}
	lose := make(chan struct{})
	s, err := bsync.NewScheduler([]bsync.Job{{
		Name: "locked", Kind: bsync.JobSync, Resources: []backstop.Resource{backstop.Contacts, backstop.Chats}, Every: time.Hour,
	}}, bsync.SchedulerOptions{
		Engine: &bsync.Engine{Source: src, Mirror: db},
		Store:  jobStore{db},
		Locker: losingLocker{lose: lose},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	go func() { <-started; close(lose) }()
	run, err := s.RunJob(t.Context(), "locked")
	if !errors.Is(err, bsync.ErrJobLockLost) || run.Status != bsync.JobInterrupted {
		t.Fatalf("run %+v, err %v; want interrupted with ErrJobLockLost", run, err)
	}
	if n := strings.Count(err.Error(), "context canceled"); n != 1 {
		t.Errorf("error %q says context canceled %d times, want once", err, n)
	}
	runs, err := db.JobRuns(t.Context(), "locked", 0)
	if err != nil || len(runs) != 1 || !strings.Contains(runs[0].Error, "job lock lost") || runs[0].Status != "interrupted" {
		t.Fatalf("stored runs %+v (%v): want one interrupted run whose error says the lock was lost", runs, err)
	}
}

// Before Start, NextRun of an interval job says what Start will do: with
// the store's history (JobHistory), an overdue job runs at once and one
// that ran lately an interval after that run; with a store that keeps
// none, gocron runs it an interval after Start.
func TestNextRunOfIntervalJobFollowsHistory(t *testing.T) {
	db := openStore(t)
	now := time.Now()
	for _, run := range []store.JobRun{
		{Job: "overdue", Kind: "sync", StartedAt: now.Add(-2 * time.Hour), Status: "ok"},
		{Job: "recent", Kind: "sync", StartedAt: now.Add(-10 * time.Minute), Status: "failed"},
	} {
		if _, err := db.SaveJobRun(context.Background(), run); err != nil {
			t.Fatal(err)
		}
	}
	jobs := []bsync.Job{
		{Name: "overdue", Kind: bsync.JobSync, Every: time.Hour},
		{Name: "recent", Kind: bsync.JobSync, Every: time.Hour},
	}
	for _, tc := range []struct {
		name          string
		store         bsync.JobStore
		overdue, next time.Time
	}{
		{"history", jobStore{db}, now, now.Add(50 * time.Minute)},
		{"no history", struct{ bsync.JobStore }{jobStore{db}}, now.Add(time.Hour), now.Add(50 * time.Minute)},
	} {
		s, err := bsync.NewScheduler(jobs, bsync.SchedulerOptions{Engine: &bsync.Engine{}, Store: tc.store,
			Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		for job, want := range map[string]time.Time{"overdue": tc.overdue, "recent": tc.next} {
			// after is the last run's start, as backstop jobs passes it.
			last := now.Add(-2 * time.Hour)
			if job == "recent" {
				last = now.Add(-10 * time.Minute)
			}
			got, err := s.NextRun(job, last)
			if err != nil || got.Sub(want).Abs() > time.Millisecond {
				t.Errorf("%s: %s: next run %v, %v; want %v", tc.name, job, got, err, want)
			}
		}
		s.Stop()
	}
}

// A run is stored as running when it starts, beats while it goes on
// (even while it waits, here on a page that does not come), and is
// finished in place.
// startFails is a job store whose StartJobRun fails, as a store busy past
// its timeout would.
type startFails struct{ jobStore }

func (startFails) StartJobRun(context.Context, bsync.JobRun) (int64, error) {
	return 0, errors.New("database is locked")
}

// A run whose start cannot be stored still runs, and is stored when it
// ends: losing the start's record must not cost the run (nor its record).
func TestJobRunsWhenItsStartCannotBeStored(t *testing.T) {
	db := openStore(t)
	var lists atomic.Int32
	src := funcSource{ListFunc: func(ctx context.Context, req backstop.ListRequest) (backstop.Page, error) {
		lists.Add(1)
		return backstop.Page{Cost: backstop.Cost{Requests: 1}}, nil
	}}
	s, err := bsync.NewScheduler([]bsync.Job{{
		Name: "nightly", Kind: bsync.JobSync, Resources: []backstop.Resource{backstop.Contacts}, Cron: "0 3 * * *",
	}}, bsync.SchedulerOptions{Engine: &bsync.Engine{Source: src, Mirror: db}, Store: startFails{jobStore{db}}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	run, err := s.RunJob(t.Context(), "nightly")
	if err != nil || run.Status != bsync.JobOK || lists.Load() == 0 {
		t.Fatalf("RunJob = %+v, %v after %d pages read; want the run made, ok", run, err, lists.Load())
	}
	runs, err := db.JobRuns(t.Context(), "nightly", 0)
	if err != nil || len(runs) != 1 || runs[0].ID != run.ID || runs[0].Status != "ok" || runs[0].Counts.Requests != 1 {
		t.Errorf("stored runs %+v (%v), want the run, ok, stored when it ended", runs, err)
	}
}

func TestJobRunIsStoredRunningAndBeats(t *testing.T) {
	db := openStore(t)
	release := make(chan struct{})
	src := funcSource{ListFunc: func(ctx context.Context, req backstop.ListRequest) (backstop.Page, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return backstop.Page{}, ctx.Err()
		}
		return backstop.Page{Cost: backstop.Cost{Requests: 1}}, nil
	}}
	s, err := bsync.NewScheduler([]bsync.Job{{
		Name: "slow", Kind: bsync.JobSync, Resources: []backstop.Resource{backstop.Contacts}, Cron: "0 3 * * *",
	}}, bsync.SchedulerOptions{Engine: &bsync.Engine{Source: src, Mirror: db}, Store: jobStore{db}, Heartbeat: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	type result struct {
		run bsync.JobRun
		err error
	}
	done := make(chan result, 1)
	go func() {
		run, err := s.RunJob(t.Context(), "slow")
		done <- result{run, err}
	}()
	var first store.JobRun
	waitFor(t, "the run stored as running, then a heartbeat", func() bool {
		run, ok, err := db.LastJobRun(t.Context(), "slow")
		if err != nil {
			t.Fatal(err)
		}
		if !ok || run.Status != "running" {
			return false
		}
		if first.ID == 0 {
			first = run
		}
		return run.HeartbeatAt.After(first.HeartbeatAt)
	})
	close(release)
	res := <-done
	if res.err != nil || res.run.ID != first.ID || res.run.Status != bsync.JobOK {
		t.Fatalf("RunJob = %+v, %v; want run %d ok", res.run, res.err, first.ID)
	}
	runs, err := db.JobRuns(t.Context(), "slow", 0)
	if err != nil || len(runs) != 1 || runs[0].Status != "ok" || runs[0].Counts.Requests != 1 {
		t.Errorf("stored runs %+v (%v), want the one run, ok", runs, err)
	}
}

// RunJobNotify calls started once a run is past its guards and stored as
// running, before its work; never for a run refused because the job is
// running already. (The dashboard's Run now answers "started" on it.)
func TestRunJobNotifySaysWhenTheRunStarts(t *testing.T) {
	db := openStore(t)
	release := make(chan struct{})
	working := make(chan struct{}, 10)
	var listed atomic.Int32
	src := funcSource{ListFunc: func(ctx context.Context, req backstop.ListRequest) (backstop.Page, error) {
		listed.Add(1)
		working <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return backstop.Page{}, ctx.Err()
		}
		return backstop.Page{NextCursor: "c1", Cost: backstop.Cost{Requests: 1}}, nil
	}}
	s, err := bsync.NewScheduler([]bsync.Job{{
		Name: "hand", Kind: bsync.JobSync, Resources: []backstop.Resource{backstop.Contacts}, Cron: "0 0 1 1 *",
	}}, bsync.SchedulerOptions{Engine: &bsync.Engine{Source: src, Mirror: db}, Store: jobStore{db}})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	var stateAtStart string
	first := make(chan error, 1)
	go func() {
		_, err := s.RunJobNotify(t.Context(), "hand", func() {
			calls.Add(1)
			if listed.Load() != 0 {
				stateAtStart = "work had begun"
				return
			}
			runs, err := db.JobRuns(context.Background(), "hand", 0)
			if err == nil && len(runs) == 1 {
				stateAtStart = runs[0].Status
			}
		})
		first <- err
	}()
	<-working // the first run is at work
	if calls.Load() != 1 || stateAtStart != "running" {
		t.Fatalf("started called %d times, the run %q when it was; want once, stored as running, before its work", calls.Load(), stateAtStart)
	}
	_, err = s.RunJobNotify(t.Context(), "hand", func() { calls.Add(1) })
	if !errors.Is(err, bsync.ErrJobRunning) || calls.Load() != 1 {
		t.Errorf("a second run while the first works: %v, started called %d times in all; want ErrJobRunning and no call", err, calls.Load())
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

// A running job run's heartbeat stores its counts so far, page by page:
// backstop jobs shows them while it goes on, and a run killed midway is
// closed as abandoned with what it had done instead of nothing.
func TestJobRunHeartbeatStoresCountsSoFar(t *testing.T) {
	w := newWorld(t, 60)
	release := make(chan struct{})
	var lists atomic.Int32
	src := funcSource{ListFunc: func(ctx context.Context, req backstop.ListRequest) (backstop.Page, error) {
		if lists.Add(1) > 3 { // three pages, then the platform hangs
			select {
			case <-release:
			case <-ctx.Done():
				return backstop.Page{}, ctx.Err()
			}
		}
		return w.engine.Source.List(ctx, req)
	}}
	s, err := bsync.NewScheduler([]bsync.Job{{
		Name: "nightly", Kind: bsync.JobSync, Resources: []backstop.Resource{backstop.Contacts}, Cron: "0 3 * * *",
	}}, bsync.SchedulerOptions{Engine: &bsync.Engine{Source: src, Mirror: w.db, PageSize: 10}, Store: jobStore{w.db},
		Heartbeat: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	done := make(chan error, 1)
	go func() {
		_, err := s.RunJob(t.Context(), "nightly")
		done <- err
	}()
	waitFor(t, "the running run's counts of its three pages stored", func() bool {
		run, ok, err := w.db.LastJobRun(t.Context(), "nightly")
		if err != nil {
			t.Fatal(err)
		}
		return ok && run.Status == "running" && run.Counts.Pages == 3 && run.Counts.Objects == 30 && run.Counts.New == 30
	})
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	run, _, err := w.db.LastJobRun(t.Context(), "nightly")
	if err != nil || run.Status != "ok" || run.Counts.Objects != 60 {
		t.Errorf("finished run %+v (%v), want ok with its 60 objects", run, err)
	}
}
