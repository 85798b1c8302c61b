package sync_test

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-sync/backstop/internal/redistest"
	bsync "github.com/backstop-sync/backstop/sync"
)

func newJobLocks(t *testing.T, rdb *redis.Client, ttl time.Duration) *bsync.RedisJobLocks {
	t.Helper()
	l, err := bsync.NewRedisJobLocks(rdb, bsync.LeaseOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A job's lock has one holder across processes; released, it is free at once.
func TestRedisJobLocksOneHolder(t *testing.T) {
	rdb := redisClient(t)
	ctx := context.Background()
	a, b := newJobLocks(t, rdb, 3*time.Second), newJobLocks(t, rdb, 3*time.Second)
	_, release, err := a.LockJob(ctx, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.LockJob(ctx, "nightly"); !errors.Is(err, bsync.ErrJobRunning) {
		t.Fatalf("second process: %v, want ErrJobRunning", err)
	}
	if _, rel, err := b.LockJob(ctx, "other-job"); err != nil {
		t.Fatalf("another job's lock: %v", err)
	} else {
		rel()
	}
	release()
	_, release, err = b.LockJob(ctx, "nightly")
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	release()
}

// A run whose lock is taken by another process (the key lost with a
// restarted Redis, then taken) is cancelled with ErrJobLockLost.
func TestRedisJobLockLost(t *testing.T) {
	rdb := redisClient(t)
	ctx := context.Background()
	ttl := 300 * time.Millisecond
	rctx, release, err := newJobLocks(t, rdb, ttl).LockJob(ctx, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if err := rdb.Set(ctx, bsync.DefaultJobLockPrefix+"nightly", `someone-else {"host":"h2","pid":7,"run":242}`, 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rctx.Done():
		// The cause names who holds it now: another process, or a lock
		// Redis brought back with a snapshot (run 242 may have ended).
		if cause := context.Cause(rctx); !errors.Is(cause, bsync.ErrJobLockLost) || !strings.Contains(cause.Error(), "now held by host h2 pid 7 run 242") {
			t.Errorf("run cancelled with %v, want ErrJobLockLost naming host h2 pid 7 run 242", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the run went on after another process took its lock")
	}
}

// Two schedulers (two processes) on one Redis: while one runs a job, the
// other's RunJob of it is skipped and stored as skipped; once the first
// ends, the second runs it.
func TestRunJobSkipsAJobRunningInAnotherProcess(t *testing.T) {
	rdb := redisClient(t)
	ctx := context.Background()
	jobs := []bsync.Job{{Name: "prune", Kind: bsync.JobMaintenance, Every: time.Hour}}
	busy := &blockingStore{entered: make(chan struct{}, 1), cause: make(chan error, 1)}
	first, err := bsync.NewScheduler(jobs, bsync.SchedulerOptions{Engine: &bsync.Engine{}, Store: busy,
		Locker: newJobLocks(t, rdb, 3*time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	other := &countingStore{}
	second, err := bsync.NewScheduler(jobs, bsync.SchedulerOptions{Engine: &bsync.Engine{}, Store: other,
		Locker: newJobLocks(t, rdb, 3*time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Stop(); second.Stop() })

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := first.RunJob(runCtx, "prune"); done <- err }()
	select {
	case <-busy.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first run did not start")
	}
	run, err := second.RunJob(ctx, "prune")
	if !errors.Is(err, bsync.ErrJobRunning) || run.Status != bsync.JobSkipped {
		t.Fatalf("second process's run: %s, %v; want skipped with ErrJobRunning", run.Status, err)
	}
	if n := other.runs.Load(); n != 1 {
		t.Errorf("second process stored %d runs, want the skipped one", n)
	}
	stop()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the first run did not end")
	}
	if run, err := second.RunJob(ctx, "prune"); err != nil || run.Status != bsync.JobOK {
		t.Fatalf("second process after the first ended: %s, %v; want ok", run.Status, err)
	}
}

// A run whose Redis hangs (it stops answering without closing the
// connection) stops once its lock's TTL has passed since its last renewal,
// when the key may have expired and another process may run the job: not
// only once the hung renewal gives up, and not never, should it then
// succeed.
func TestRedisJobLockRunStopsWithinTTLWhileRedisHangs(t *testing.T) {
	srv := redistest.Start(t)
	// Slow to give up, as a client with retries is on a hung server.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 20 * time.Second, MaxRetries: -1})
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close(); admin.Close() })
	ctx := context.Background()
	const (
		ttl   = 600 * time.Millisecond
		pause = 6 * time.Second
	)
	locked := time.Now()
	rctx, release, err := newJobLocks(t, rdb, ttl).LockJob(ctx, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if err := admin.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rctx.Done():
		took := time.Since(locked)
		if cause := context.Cause(rctx); !errors.Is(cause, bsync.ErrJobLockLost) {
			t.Errorf("run cancelled with %v, want ErrJobLockLost", cause)
		}
		if took < ttl {
			t.Errorf("run stopped %s after its lock was taken, before its %s TTL", took, ttl)
		}
	case <-time.After(pause - time.Second):
		t.Fatalf("Redis hung for %s, and the run went on past its lock's %s TTL", pause-time.Second, ttl)
	}
}

// A run refused for its job's lock names the run that holds it: its host,
// pid and stored run, and when the lock expires unless renewed. It used
// to say only "in another process" (found by a fleet audit). A lock held
// under an old-form token (a bare token, as earlier versions wrote it)
// names no holder, and still refuses.
func TestJobLockRefusalNamesTheHolder(t *testing.T) {
	rdb := redisClient(t)
	ctx := context.Background()
	jobs := []bsync.Job{{Name: "prune", Kind: bsync.JobMaintenance, Every: time.Hour}}
	busy := &blockingStore{entered: make(chan struct{}, 1), cause: make(chan error, 1)}
	busy.runs.Store(44) // the holder's run is stored as 45
	// Short, as the first lock of a job in a Redis waits its TTL (see
	// TestJobLockAfterRedisLostItsDataRunsDoNotOverlap).
	const ttl = 2 * time.Second
	first, err := bsync.NewScheduler(jobs, bsync.SchedulerOptions{Engine: &bsync.Engine{}, Store: busy,
		Locker: newJobLocks(t, rdb, ttl)})
	if err != nil {
		t.Fatal(err)
	}
	skips := &skipRecorder{}
	second, err := bsync.NewScheduler(jobs, bsync.SchedulerOptions{Engine: &bsync.Engine{}, Store: skips,
		Locker: newJobLocks(t, rdb, ttl)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Stop(); second.Stop() })

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := first.RunJob(runCtx, "prune"); done <- err }()
	select {
	case <-busy.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first run did not start")
	}
	_, err = second.RunJob(ctx, "prune")
	host, _ := os.Hostname()
	want := regexp.MustCompile(`^job prune: job is still running in another process \(host ` + regexp.QuoteMeta(host) +
		` pid ` + strconv.Itoa(os.Getpid()) + `, run 45, lock expires in [12]s\)$`)
	if !errors.Is(err, bsync.ErrJobRunning) || !want.MatchString(err.Error()) {
		t.Errorf("refused with %v, want ErrJobRunning matching %s", err, want)
	}
	// The skipped run is stored naming the holder too, for backstop jobs
	// and the dashboard: it was stored without an error.
	if saved := skips.saved(); len(saved) != 1 || saved[0].Status != bsync.JobSkipped || saved[0].Err == nil || !want.MatchString(saved[0].Err.Error()) {
		t.Errorf("stored skipped runs %+v, want one whose error matches %s", saved, want)
	}
	stop()
	<-done

	key := bsync.DefaultJobLockPrefix + "prune"
	if err := rdb.Set(ctx, key, "0123456789abcdef01234567", 30*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	_, _, err = newJobLocks(t, rdb, ttl).LockJob(ctx, "prune")
	want = regexp.MustCompile(`^job prune: job is still running in another process \(lock expires in (29|30)s\)$`)
	if !errors.Is(err, bsync.ErrJobRunning) || !want.MatchString(err.Error()) {
		t.Errorf("refused for an old-form lock with %v, want ErrJobRunning matching %s", err, want)
	}
}

// runSpans records when each process's runs of a job did their work.
type runSpans struct {
	mu    stdsync.Mutex
	spans []runSpan
}

type runSpan struct {
	who        string
	start, end time.Time
}

// spanStore is a JobStore whose maintenance runs until its context ends,
// recording its span in spans under who.
type spanStore struct {
	countingStore
	who     string
	spans   *runSpans
	entered chan struct{}
}

func (s *spanStore) PruneProcessed(ctx context.Context, _ time.Time) (int64, error) {
	start := time.Now()
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	s.spans.mu.Lock()
	s.spans.spans = append(s.spans.spans, runSpan{who: s.who, start: start, end: time.Now()})
	s.spans.mu.Unlock()
	return 0, ctx.Err()
}

// Redis losing its data (FLUSHALL, a restart without persistence) under a
// running job: the standby, now leader, takes the job's free lock at
// once, but its run waits one lock TTL before it starts, by when the run
// that held the lock has stopped (its renewal finds the lock taken, or its
// TTL passes unrenewed). Its run used to start at once, beside the other
// for up to a third of the TTL (found by a fleet audit). The spans of the
// two runs are compared, as the stores recorded them.
func TestJobLockAfterRedisLostItsDataRunsDoNotOverlap(t *testing.T) {
	rdb := redisClient(t)
	ctx := context.Background()
	// The standby must take the lease (150 ms) and its next tick (100 ms)
	// come before the holder's next renewal (a third of the TTL) finds
	// the lock free and takes it back: 2 s leave room on a loaded machine.
	const lockTTL = 6 * time.Second
	spans := &runSpans{}
	jobs := []bsync.Job{{Name: "prune", Kind: bsync.JobMaintenance, Every: 100 * time.Millisecond}}
	// The holder: the run of a leader, or one by hand (backstop run),
	// which takes the lock and no lease.
	holder := &spanStore{who: "holder", spans: spans, entered: make(chan struct{}, 1)}
	first, err := bsync.NewScheduler(jobs, bsync.SchedulerOptions{Engine: &bsync.Engine{}, Store: holder,
		Locker: newJobLocks(t, rdb, lockTTL)})
	if err != nil {
		t.Fatal(err)
	}
	// The standby: its lease is renewed often, so that it is the first to
	// take the lease and the lock once Redis lost them.
	standby := &spanStore{who: "standby", spans: spans, entered: make(chan struct{}, 1)}
	second, err := bsync.NewScheduler(jobs, bsync.SchedulerOptions{Engine: &bsync.Engine{}, Store: standby,
		Elector: newLease(t, rdb, 150*time.Millisecond), Locker: newJobLocks(t, rdb, lockTTL)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { second.Stop(); first.Stop() })

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { _, err := first.RunJob(runCtx, "prune"); done <- err }()
	select {
	case <-holder.entered:
	case <-time.After(3 * lockTTL):
		t.Fatal("the holder's run did not start")
	}
	second.Start()
	// Flushed just after the holder renewed its lock: its next renewal,
	// which finds the lock taken, comes a third of the TTL later.
	key := bsync.DefaultJobLockPrefix + "prune"
	waitFor(t, "the holder's renewal", func() bool {
		ttl, err := rdb.PTTL(ctx, key).Result()
		return err == nil && ttl > lockTTL-100*time.Millisecond
	})
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-standby.entered:
	case <-time.After(3 * lockTTL):
		t.Fatal("the standby's run did not start after the flush")
	}
	select {
	case err := <-done:
		if !errors.Is(err, bsync.ErrJobLockLost) {
			t.Errorf("the holder's run ended with %v, want ErrJobLockLost", err)
		}
	case <-time.After(3 * lockTTL):
		t.Fatal("the holder's run went on")
	}
	second.Stop()
	spans.mu.Lock()
	defer spans.mu.Unlock()
	var h, s *runSpan
	for i := range spans.spans {
		switch sp := &spans.spans[i]; sp.who {
		case "holder":
			h = sp
		case "standby":
			s = sp
		}
	}
	if h == nil || s == nil {
		t.Fatalf("spans %+v, want one of each", spans.spans)
	}
	if !s.start.After(h.end) {
		t.Errorf("the runs overlapped by %s: the standby's started at %s, the holder's ended at %s",
			h.end.Sub(s.start), s.start.Format(time.StampMilli), h.end.Format(time.StampMilli))
	}
}

// lockTook takes job's lock with l and returns how long LockJob took,
// releasing the lock at once.
func lockTook(t *testing.T, ctx context.Context, l *bsync.RedisJobLocks, job string) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	_, release, err := l.LockJob(ctx, job)
	took := time.Since(start)
	if err == nil {
		release()
	}
	return took, err
}

// Redis restarted from a snapshot that kept the lock's record but not the
// lock (taken after the snapshot): the record names the server of before
// the restart, so the next lock waits the fence out, as after a FLUSHALL;
// taken again on the same server, it does not. (A record that only said
// "Redis kept its data" was restored with the snapshot, and the lock was
// taken at once while a run that held it could still go on.)
func TestJobLockAfterRedisRestartedFromASnapshotWaitsTheFence(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: 3})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	const ttl = time.Second
	l := newJobLocks(t, rdb, ttl)
	if took, err := lockTook(t, ctx, l, "nightly"); err != nil || took < ttl*9/10 {
		t.Fatalf("first lock in a fresh Redis: %v after %s, want the fence (%s)", err, took, ttl)
	}
	if took, err := lockTook(t, ctx, l, "nightly"); err != nil || took > ttl/2 {
		t.Fatalf("lock on the same server: %v after %s, want no fence", err, took)
	}
	if err := rdb.Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	if n, err := rdb.Exists(ctx, bsync.DefaultJobLockPrefix+"nightly:record").Result(); err != nil || n != 1 {
		t.Fatalf("the snapshot did not keep the record: %d %v", n, err)
	}
	if took, err := lockTook(t, ctx, l, "nightly"); err != nil || took < ttl*9/10 {
		t.Errorf("lock after Redis restarted from a snapshot: %v after %s, want the fence (%s)", err, took, ttl)
	}
	if took, err := lockTook(t, ctx, l, "nightly"); err != nil || took > ttl/2 {
		t.Errorf("lock again on the restarted server: %v after %s, want no fence", err, took)
	}
}

// A fence given up (its ctx ended) takes the lock's record away with the
// lock: the next process to take the lock waits the fence out too, since
// a run that held the lost lock was not waited for.
func TestJobLockFenceGivenUpLeavesTheNextOneFenced(t *testing.T) {
	rdb := redisClient(t)
	ctx := context.Background()
	const ttl = time.Second
	a, b := newJobLocks(t, rdb, ttl), newJobLocks(t, rdb, ttl)
	short, cancel := context.WithTimeout(ctx, ttl/5)
	defer cancel()
	if _, err := lockTook(t, short, a, "nightly"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a fence cut short by its ctx: %v, want context.DeadlineExceeded", err)
	}
	if took, err := lockTook(t, ctx, b, "nightly"); err != nil || took < ttl*9/10 {
		t.Errorf("the next lock: %v after %s, want the fence (%s)", err, took, ttl)
	}
}

// skipRecorder is a countingStore that keeps the runs saved without
// starting (skipped ones).
type skipRecorder struct {
	countingStore
	mu   stdsync.Mutex
	runs []bsync.JobRun
}

func (s *skipRecorder) SaveJobRun(ctx context.Context, run bsync.JobRun) (int64, error) {
	s.mu.Lock()
	s.runs = append(s.runs, run)
	s.mu.Unlock()
	return s.countingStore.SaveJobRun(ctx, run)
}

func (s *skipRecorder) saved() []bsync.JobRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]bsync.JobRun(nil), s.runs...)
}

// A caller that asked (WithLockWait) is told, before LockJob returns, that
// the lock was taken and how long it waits before the run: the fence of a
// lock new to this Redis. A lock Redis has a record of is not waited for,
// and the caller hears nothing.
func TestJobLockTellsTheCallerItWaitsTheFence(t *testing.T) {
	rdb := redisClient(t)
	const ttl = time.Second
	l := newJobLocks(t, rdb, ttl)
	var told []time.Duration
	var toldAt time.Time
	ctx := bsync.WithLockWait(context.Background(), func(wait time.Duration) {
		told = append(told, wait)
		toldAt = time.Now()
	})
	start := time.Now()
	_, release, err := l.LockJob(ctx, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	returned := time.Now()
	release()
	if len(told) != 1 || told[0] != ttl {
		t.Fatalf("told %v, want one wait of the lock's TTL (%s)", told, ttl)
	}
	if toldAt.Sub(start) > ttl/2 || returned.Sub(toldAt) < ttl*9/10 {
		t.Errorf("told %s after the call and %s before it returned, want at once and a TTL before", toldAt.Sub(start), returned.Sub(toldAt))
	}
	told = nil
	_, release, err = l.LockJob(ctx, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	release()
	if len(told) != 0 {
		t.Errorf("a lock with its record: told %v, want nothing", told)
	}
}
