package sync_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-sync/backstop/internal/redistest"
	"github.com/backstop-sync/backstop/internal/syncbuf"
	bsync "github.com/backstop-sync/backstop/sync"
)

func newLease(t *testing.T, rdb *redis.Client, ttl time.Duration) *bsync.RedisLease {
	t.Helper()
	l, err := bsync.NewRedisLease(rdb, bsync.LeaseOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func redisClient(t *testing.T) *redis.Client {
	t.Helper()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// One process holds the lease; when it stops renewing, another takes it
// within the TTL; when it resigns, at once.
func TestRedisLeaseElectsOneLeader(t *testing.T) {
	rdb := redisClient(t)
	ctx := context.Background()
	const ttl = 600 * time.Millisecond
	a, b, c := newLease(t, rdb, ttl), newLease(t, rdb, ttl), newLease(t, rdb, ttl)
	if err := a.IsLeader(ctx); err != nil {
		t.Fatalf("first to ask: %v, want the lease", err)
	}
	for _, l := range []*bsync.RedisLease{b, c} {
		if err := l.IsLeader(ctx); !errors.Is(err, bsync.ErrNotLeader) {
			t.Fatalf("second to ask: %v, want ErrNotLeader", err)
		}
	}
	if err := a.IsLeader(ctx); err != nil {
		t.Fatalf("leader renewing: %v", err)
	}

	// a dies: b asks until it has the lease.
	died := time.Now()
	waitFor(t, "b to take over", func() bool { return b.IsLeader(ctx) == nil })
	// Not before the lease expires (less what the clock read after the
	// renewal may lag), and soon after: the slack is for a loaded machine.
	switch took := time.Since(died); {
	case took < ttl/2:
		t.Errorf("b took over %s after a's renewal, inside the %s lease", took, ttl)
	case took > ttl+time.Second:
		t.Errorf("takeover took %s, want within the %s lease", took, ttl)
	}
	if err := c.IsLeader(ctx); !errors.Is(err, bsync.ErrNotLeader) {
		t.Errorf("c after the takeover: %v, want ErrNotLeader", err)
	}
	if err := a.IsLeader(ctx); !errors.Is(err, bsync.ErrNotLeader) || a.Leader() {
		t.Errorf("a back from the dead: %v, want ErrNotLeader", err)
	}

	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.IsLeader(ctx); err != nil {
		t.Errorf("after the leader resigned: %v, want the lease at once", err)
	}
	if err := a.Resign(ctx); err != nil || c.IsLeader(ctx) != nil {
		t.Errorf("a non-leader's resignation ended c's lease (%v)", err)
	}
}

// countingStore is a JobStore that counts the runs it is given (each
// stored once: skipped, or at its start).
type countingStore struct{ runs atomic.Int64 }

func (s *countingStore) SaveJobRun(context.Context, bsync.JobRun) (int64, error) {
	return s.runs.Add(1), nil
}
func (s *countingStore) StartJobRun(context.Context, bsync.JobRun) (int64, error) {
	return s.runs.Add(1), nil
}
func (*countingStore) JobRunHeartbeat(context.Context, int64) error             { return nil }
func (*countingStore) FinishJobRun(context.Context, bsync.JobRun) error         { return nil }
func (*countingStore) AbandonStaleJobRuns(context.Context) (int64, error)       { return 0, nil }
func (*countingStore) PruneProcessed(context.Context, time.Time) (int64, error) { return 0, nil }
func (*countingStore) PruneJobRuns(context.Context, time.Time) (int64, error)   { return 0, nil }
func (*countingStore) PruneAttempts(context.Context, time.Time) (int64, error)  { return 0, nil }
func (*countingStore) PruneDelivered(context.Context, time.Time) (int64, error) { return 0, nil }
func (*countingStore) PruneReconcileRuns(context.Context, time.Time) (int64, error) {
	return 0, nil
}
func (*countingStore) AbandonStaleReconciles(context.Context) (int64, error) { return 0, nil }

// Two schedulers with the same job: only the leader runs it; when the
// leader stops, the other takes over.
func TestSchedulerRunsJobsOnlyOnTheLeader(t *testing.T) {
	rdb := redisClient(t)
	job := []bsync.Job{{Name: "prune", Kind: bsync.JobMaintenance, Every: 50 * time.Millisecond}}
	var stores [2]countingStore
	var scheds [2]*bsync.Scheduler
	var leases [2]*bsync.RedisLease
	for i := range scheds {
		leases[i] = newLease(t, rdb, 3*time.Second)
		s, err := bsync.NewScheduler(job, bsync.SchedulerOptions{
			Engine: &bsync.Engine{}, Store: &stores[i], Elector: leases[i],
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Stop() })
		scheds[i] = s
	}
	scheds[0].Start()
	waitFor(t, "the first scheduler to lead", leases[0].Leader)
	scheds[1].Start()
	waitFor(t, "ten runs", func() bool { return stores[0].runs.Load() >= 10 })
	if n := stores[1].runs.Load(); n != 0 || leases[1].Leader() {
		t.Fatalf("the follower ran the job %d times", n)
	}
	// A stop in order resigns: the follower takes over well before the
	// three-second lease would have expired.
	stopped := time.Now()
	if err := scheds[0].Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the follower to run the job", func() bool { return stores[1].runs.Load() >= 3 })
	if took := time.Since(stopped); took > 2*time.Second {
		t.Errorf("takeover after a resignation took %s", took)
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// A term lasts while the lease is renewed; a failed renewal does not end
// it (the key still holds in Redis), finding another holder does at once,
// and a term not renewed ends TTL after its last renewal began.
func TestRedisLeaseTerm(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	a, b := newLease(t, rdb, 10*time.Second), newLease(t, rdb, 10*time.Second)
	if !isClosed(a.Lost()) {
		t.Fatal("a process that never led has an open term")
	}
	if err := a.IsLeader(ctx); err != nil {
		t.Fatal(err)
	}
	term := a.Lost()
	if err := a.IsLeader(ctx); err != nil || a.Lost() != term || isClosed(term) {
		t.Fatalf("a renewal (%v) changed or ended the term", err)
	}

	srv.Stop()
	if err := a.IsLeader(ctx); err == nil {
		t.Fatal("renewal with Redis stopped succeeded")
	}
	if isClosed(term) {
		t.Fatal("one failed renewal ended the term while the key still held")
	}
	srv.Restart() // empty: the key is gone, and b takes it
	if err := b.IsLeader(ctx); err != nil {
		t.Fatalf("b after the restart: %v", err)
	}
	if err := a.IsLeader(ctx); !errors.Is(err, bsync.ErrNotLeader) {
		t.Fatalf("a after b took the key: %v, want ErrNotLeader", err)
	}
	if !isClosed(term) {
		t.Fatal("a's term goes on while b holds the lease")
	}

	const ttl = 200 * time.Millisecond
	c, err := bsync.NewRedisLease(rdb, bsync.LeaseOptions{Key: "term-test", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.IsLeader(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "an unrenewed term to end", func() bool { return isClosed(c.Lost()) })
	if took := time.Since(start); took < ttl {
		t.Errorf("an unrenewed term ended after %s, before its %s TTL", took, ttl)
	}
}

// blockingStore is a JobStore whose maintenance runs until its context
// ends, then reports the context's cause.
type blockingStore struct {
	countingStore
	entered chan struct{}
	cause   chan error
}

func (s *blockingStore) PruneProcessed(ctx context.Context, _ time.Time) (int64, error) {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	select {
	case s.cause <- context.Cause(ctx):
	default:
	}
	return 0, ctx.Err()
}

// A scheduled run stops when its process finds another holding the lease,
// instead of going on beside the new leader's runs.
func TestSchedulerStopsARunWhenTheLeaseIsLost(t *testing.T) {
	rdb := redisClient(t)
	ctx := context.Background()
	st := &blockingStore{entered: make(chan struct{}, 1), cause: make(chan error, 1)}
	s, err := bsync.NewScheduler([]bsync.Job{{Name: "prune", Kind: bsync.JobMaintenance, Every: 50 * time.Millisecond}},
		bsync.SchedulerOptions{Engine: &bsync.Engine{}, Store: st, Elector: newLease(t, rdb, 3*time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop() })
	s.Start()
	select {
	case <-st.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the job did not start")
	}
	// The key is lost (a restarted Redis) and another process takes it:
	// in one command, so that this one's campaign cannot take it back.
	other := newLease(t, rdb, 3*time.Second)
	if err := rdb.Set(ctx, bsync.DefaultLeaseKey, other.ID(), 3*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case cause := <-st.cause:
		if !errors.Is(cause, bsync.ErrNotLeader) {
			t.Errorf("run cancelled with %v, want ErrNotLeader", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the run went on after another process took the lease")
	}
}

// A process standing by says so once, at INFO, naming the holder of the
// lease, rather than at every attempt; again when another takes it over.
func TestRedisLeaseLogsStandbyOnce(t *testing.T) {
	rdb := redisClient(t)
	ctx := context.Background()
	var logs syncbuf.Buffer
	a, c := newLease(t, rdb, 3*time.Second), newLease(t, rdb, 3*time.Second)
	b, err := bsync.NewRedisLease(rdb, bsync.LeaseOptions{TTL: 3 * time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.IsLeader(ctx); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := b.IsLeader(ctx); !errors.Is(err, bsync.ErrNotLeader) {
			t.Fatalf("b: %v, want ErrNotLeader", err)
		}
	}
	const standby = "jobs run by another process: lease held by "
	if n := strings.Count(logs.String(), standby+a.ID()); n != 1 {
		t.Fatalf("%d standby lines naming %s after five attempts, want 1:\n%s", n, a.ID(), logs.String())
	}
	if !strings.Contains(a.ID(), ":") {
		t.Errorf("lease id %q does not name its host and pid", a.ID())
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.IsLeader(ctx); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_ = b.IsLeader(ctx)
	}
	if n := strings.Count(logs.String(), standby); n != 2 || !strings.Contains(logs.String(), standby+c.ID()) {
		t.Errorf("after c took over: %d standby lines, want a second one naming %s:\n%s", n, c.ID(), logs.String())
	}
}

// A leader whose Redis hangs (it stops answering without closing the
// connection) stops being the leader when its term runs out, also on
// Leader (backstop_jobs_leader), not only once the hung renewal gives up;
// a renewal answered after its term would have ended does not count; and
// the renewal that makes it the leader again says so.
func TestRedisLeaseTermRunsOutWhileRedisHangs(t *testing.T) {
	srv := redistest.Start(t)
	// Slow to give up, as a client with retries is on a hung server.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 20 * time.Second, MaxRetries: -1})
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close(); admin.Close() })
	ctx := context.Background()
	var logs syncbuf.Buffer
	const ttl = 500 * time.Millisecond
	l, err := bsync.NewRedisLease(rdb, bsync.LeaseOptions{TTL: ttl,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.IsLeader(ctx); err != nil || !l.Leader() {
		t.Fatalf("first attempt: %v, leader %v", err, l.Leader())
	}
	// Redis stops answering for a while: the next renewal hangs.
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "3000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	hung := make(chan error, 1)
	go func() { hung <- l.IsLeader(ctx) }()
	waitFor(t, "the unrenewed term to end", func() bool { return isClosed(l.Lost()) })
	if l.Leader() {
		t.Error("term over (scheduled runs stopped), and Leader still reports true while the renewal hangs")
	}
	if err := <-hung; err == nil {
		t.Error("a renewal answered after its term would have ended counted as a renewal")
	}
	if l.Leader() || !isClosed(l.Lost()) {
		t.Errorf("after the late answer: leader %v, term open %v; want neither", l.Leader(), !isClosed(l.Lost()))
	}
	// Redis answers again: the next renewal starts a new term, and says so.
	if err := l.IsLeader(ctx); err != nil || !l.Leader() || isClosed(l.Lost()) {
		t.Fatalf("renewal after Redis came back: %v, leader %v", err, l.Leader())
	}
	const leads = "this process is the jobs leader"
	if n := strings.Count(logs.String(), leads); n != 2 {
		t.Errorf("%d %q lines, want 2 (one per term):\n%s", n, leads, logs.String())
	}
	if !strings.Contains(logs.String(), "expired without renewal") {
		t.Errorf("no line saying the term expired:\n%s", logs.String())
	}
}

// gatedScripter answers every lease script with 1 (the lease is this
// process's), except that a call finding a gate in gates waits until that
// gate is closed: a Redis call that hangs while others are answered.
type gatedScripter struct {
	redis.Scripter
	gates   chan chan struct{}
	waiting atomic.Int32
}

func (g *gatedScripter) EvalSha(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	select {
	case gate := <-g.gates:
		g.waiting.Add(1)
		<-gate
	default:
	}
	return redis.NewCmdResult(int64(1), nil)
}

// gocron asks IsLeader before each scheduled run while Campaign's own
// renewal may hang. A hung renewal answered after its term ran out used to
// end the term a later call had renewed in time: the leader stepped down,
// cancelled its running jobs and logged "lost (Redis unreachable)" just
// as Redis recovered. A late answer now changes nothing.
func TestRedisLeaseLateAnswerLeavesALaterTermAlone(t *testing.T) {
	g := &gatedScripter{gates: make(chan chan struct{}, 1)}
	const ttl = 300 * time.Millisecond
	l, err := bsync.NewRedisLease(g, bsync.LeaseOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := l.IsLeader(ctx); err != nil || !l.Leader() {
		t.Fatalf("first attempt: %v, leader %v", err, l.Leader())
	}
	gate := make(chan struct{})
	g.gates <- gate
	hung := make(chan error, 1)
	go func() { hung <- l.IsLeader(ctx) }() // Campaign's renewal, hanging
	waitFor(t, "the renewal to hang", func() bool { return g.waiting.Load() == 1 })
	waitFor(t, "the unrenewed term to end", func() bool { return isClosed(l.Lost()) })
	// gocron's call before a scheduled run, answered at once: a new term.
	if err := l.IsLeader(ctx); err != nil || !l.Leader() {
		t.Fatalf("renewal in time: %v, leader %v", err, l.Leader())
	}
	term := l.Lost()
	close(gate) // the hung call's answer arrives, late
	if err := <-hung; err == nil {
		t.Error("a renewal answered after its term ended counted as one")
	}
	if isClosed(term) || !l.Leader() {
		t.Errorf("the late answer of an older call ended the term a later call renewed in time: term closed %v, leader %v", isClosed(term), l.Leader())
	}
}

// On a process standing by (not the jobs leader), NextRun follows the
// schedule and the job's stored runs, as before Start, not gocron's next
// run, which a standby never moves on: the dashboard's jobs page of a
// standby serve read it minutes in the past (found by a fleet audit).
func TestNextRunOnAStandbyFollowsTheStoredRuns(t *testing.T) {
	rdb := redisClient(t)
	db := openStore(t)
	const every = 300 * time.Millisecond
	job := []bsync.Job{{Name: "prune", Kind: bsync.JobMaintenance, Every: every}}
	var scheds [2]*bsync.Scheduler
	var leases [2]*bsync.RedisLease
	for i := range scheds {
		leases[i] = newLease(t, rdb, 3*time.Second)
		s, err := bsync.NewScheduler(job, bsync.SchedulerOptions{
			Engine: &bsync.Engine{}, Store: jobStore{db}, Elector: leases[i],
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Stop() })
		scheds[i] = s
	}
	scheds[0].Start()
	waitFor(t, "the first scheduler to lead", leases[0].Leader)
	scheds[1].Start()
	ran := func() int {
		runs, err := db.JobRuns(context.Background(), "prune", 0)
		if err != nil {
			t.Fatal(err)
		}
		return len(runs)
	}
	// Until the leader has run it several times since the standby
	// started, each standby tick refused by the elector.
	base := ran()
	waitFor(t, "the leader's runs", func() bool { return ran() >= base+5 })
	if leases[1].Leader() {
		t.Fatal("the standby leads")
	}
	for range 5 {
		now := time.Now()
		next, err := scheds[1].NextRun("prune", time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		last, ok, err := db.LastJobStart(context.Background(), "prune")
		if err != nil || !ok {
			t.Fatalf("last start: %v, %v", ok, err)
		}
		if next.Before(now) || next.After(time.Now().Add(every)) && next.After(last.Add(every)) {
			t.Fatalf("standby's next run %s, called at %s: want from now to an interval after the last run's start (%s)",
				next.Format(time.StampMilli), now.Format(time.StampMilli), last.Format(time.StampMilli))
		}
	}
	// The leader's own is gocron's, which it moves on.
	if next, err := scheds[0].NextRun("prune", time.Time{}); err != nil || next.Before(time.Now().Add(-every)) {
		t.Errorf("leader's next run %s (%v), want about now", next.Format(time.StampMilli), err)
	}
}
