package sync_test

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strconv"
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
	if err := rdb.Set(ctx, bsync.DefaultJobLockPrefix+"nightly", "someone-else", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rctx.Done():
		if cause := context.Cause(rctx); !errors.Is(cause, bsync.ErrJobLockLost) {
			t.Errorf("run cancelled with %v, want ErrJobLockLost", cause)
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
	first, err := bsync.NewScheduler(jobs, bsync.SchedulerOptions{Engine: &bsync.Engine{}, Store: busy,
		Locker: newJobLocks(t, rdb, time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	second, err := bsync.NewScheduler(jobs, bsync.SchedulerOptions{Engine: &bsync.Engine{}, Store: &countingStore{},
		Locker: newJobLocks(t, rdb, time.Minute)})
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
		` pid ` + strconv.Itoa(os.Getpid()) + `, run 45, lock expires in (59s|1m0s)\)$`)
	if !errors.Is(err, bsync.ErrJobRunning) || !want.MatchString(err.Error()) {
		t.Errorf("refused with %v, want ErrJobRunning matching %s", err, want)
	}
	stop()
	<-done

	key := bsync.DefaultJobLockPrefix + "prune"
	if err := rdb.Set(ctx, key, "0123456789abcdef01234567", 30*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	_, _, err = newJobLocks(t, rdb, time.Minute).LockJob(ctx, "prune")
	want = regexp.MustCompile(`^job prune: job is still running in another process \(lock expires in (29|30)s\)$`)
	if !errors.Is(err, bsync.ErrJobRunning) || !want.MatchString(err.Error()) {
		t.Errorf("refused for an old-form lock with %v, want ErrJobRunning matching %s", err, want)
	}
}
