package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-sync/backstop/internal/redistest"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// fleetLeaders polls the serve processes' /metrics until exactly one of
// them reports backstop_jobs_leader 1 and the others 0, and returns it.
func fleetLeaders(t *testing.T, procs []*fleetProc, within time.Duration) *fleetProc {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var leaders []string
		var leader *fleetProc
		for _, p := range procs {
			if p.metrics()["backstop_jobs_leader"] == 1 {
				leaders = append(leaders, p.name)
				leader = p
			}
		}
		if len(leaders) == 1 {
			return leader
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, backstop_jobs_leader is 1 on %v, want exactly one process", within, leaders)
		}
		time.Sleep(50 * time.Millisecond) // polling /metrics, with a deadline
	}
}

// noFleetLeader polls /metrics until no serve process reports
// backstop_jobs_leader 1.
func noFleetLeader(t *testing.T, procs []*fleetProc, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var leaders []string
		for _, p := range procs {
			if p.metrics()["backstop_jobs_leader"] == 1 {
				leaders = append(leaders, p.name)
			}
		}
		if len(leaders) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis down for %s, and backstop_jobs_leader is still 1 on %v", within, leaders)
		}
		time.Sleep(50 * time.Millisecond) // polling /metrics, with a deadline
	}
}

// awaitRunning returns a process of procs with a run going on: one that
// has logged started more often than done (every run that starts logs its
// end), or fails the test after 30 s, saying when it was awaited.
func awaitRunning(t *testing.T, procs []*fleetProc, started, done, when string) *fleetProc {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, p := range procs {
			if p.count(started) > p.count(done) {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no process ran the sync again %s", when)
		}
		time.Sleep(20 * time.Millisecond) // polling the logs, with a deadline
	}
}

// totalCount sums the lines containing substr over procs.
func totalCount(procs []*fleetProc, substr string) int {
	n := 0
	for _, p := range procs {
		n += p.count(substr)
	}
	return n
}

// Three serve processes on one Redis, as an operator runs them: Redis is
// stopped under them, started again empty, then flushed. While it is down
// each says so, none claims on /metrics to lead and no job runs; once it
// is back exactly one leads again (and says so), and the job goes on
// running once per tick.
func TestFleetSurvivesRedisStopRestartAndFlush(t *testing.T) {
	t.Parallel()
	const (
		lease = 3 * time.Second
		every = 2 * time.Second
	)
	rds := redistest.Start(t)
	s := sim.New(sim.Options{Seed: 7, Objects: 10})
	dir := t.TempDir()
	cfg := writeTickConfig(t, dir, newSimServer(t, s), filepath.Join(dir, "shared.db"), rds.URL(), lease, every)
	env := []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}
	procs := startServes(t, "fleet-", 3, cfg, s.APIKey(), env)

	leader := awaitLeader(t, procs, 10*time.Second)
	leader.waitCount(jobDone, 2, 30*time.Second)
	if got := fleetLeaders(t, procs, 10*time.Second); got != leader {
		t.Fatalf("%s logged that it leads, /metrics says %s does", leader.name, got.name)
	}

	// Redis stopped: the leader says its lease is lost, and no process
	// claims to lead (or runs the job) once the lease has run out.
	rds.Stop()
	const lostLine = "jobs lease: lost (Redis unreachable)"
	leader.waitCount(lostLine, 1, 2*lease+5*time.Second)
	noFleetLeader(t, procs, 2*lease+5*time.Second)
	// Once its term has run out, nothing starts: two ticks are watched.
	leader.waitCount("jobs lease: expired without renewal", 1, 2*lease+5*time.Second)
	startedDown := totalCount(procs, "job started")
	down := time.Now().Add(2 * every)
	for time.Now().Before(down) {
		time.Sleep(50 * time.Millisecond) // an interval measured, not a synchronisation
	}
	if got := totalCount(procs, "job started"); got != startedDown {
		t.Errorf("%d runs started while Redis was down, want none", got-startedDown)
	}

	// Redis back, empty: one process leads again, logs it, and runs.
	leadsBefore := totalCount(procs, leaderLine)
	rds.Restart()
	deadline := time.Now().Add(lease + lease/3 + 10*time.Second)
	for totalCount(procs, leaderLine) == leadsBefore {
		if time.Now().After(deadline) {
			t.Fatalf("Redis back, and no process logged that it leads again")
		}
		time.Sleep(20 * time.Millisecond) // polling the logs, with a deadline
	}
	back := fleetLeaders(t, procs, 10*time.Second)
	back.waitCount(jobDone, back.count(jobDone)+2, 30*time.Second)

	// FLUSHALL under the fleet: still one leader, the job still runs.
	rdb := redis.NewClient(&redis.Options{Addr: rds.Addr()})
	defer rdb.Close()
	if err := rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	// The flushed lease goes to whichever process asks first: leadership
	// may move, but settles on one process and the job goes on.
	doneFlushed := totalCount(procs, jobDone)
	deadline = time.Now().Add(30 * time.Second)
	for totalCount(procs, jobDone) < doneFlushed+3 {
		if time.Now().After(deadline) {
			t.Fatalf("after FLUSHALL, %d runs finished in 30s, want 3", totalCount(procs, jobDone)-doneFlushed)
		}
		time.Sleep(20 * time.Millisecond) // polling the logs, with a deadline
	}
	fleetLeaders(t, procs, 10*time.Second)

	for _, p := range procs {
		if n := p.count("job stopped: its lock was lost"); n > 1 {
			t.Errorf("%s lost a job lock %d times", p.name, n)
		}
		if strings.Contains(p.output(), "level=ERROR") {
			t.Errorf("%s logged an error:\n%s", p.name, p.output())
		}
	}
	for _, p := range procs {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range procs {
		if code := p.wait(time.Minute); code != 0 {
			t.Errorf("%s: exit %d after SIGTERM\n%s", p.name, code, p.output())
		}
	}
}

// writeSlowSyncConfig writes dir/schedules.yaml for serve processes
// sharing the store at dbPath and the Redis at redisURL, with one sync job
// of contacts, slow, run every every: pages of 10 at the sim's 20 requests
// a second, so a run takes many seconds; it returns the file's path.
func writeSlowSyncConfig(t *testing.T, dir, baseURL, dbPath, redisURL string, lease, every time.Duration) string {
	t.Helper()
	return writeFile(t, dir, "schedules.yaml", fmt.Sprintf(`source:
  base_url: %s
  api_key: ${BOTIX_API_KEY}
  page_size: 10
  rate_limit: {per_minute: 1200, reserve: 2, window: 1s}
store:
  path: %s
governor:
  redis: %s
  job_lease: %s
intake:
  listen: 127.0.0.1:0
  secret: ${BOTIX_WEBHOOK_SECRET}
jobs:
  - {name: slow, kind: sync, resources: [contacts], every: %s}
  - {name: prune, kind: maintenance, cron: "30 4 * * *"}
`, baseURL, dbPath, redisURL, lease, every))
}

// jobRuns returns the stored runs of job, oldest first.
func jobRuns(t *testing.T, dbPath, job string) []store.JobRun {
	t.Helper()
	db, err := store.Open(context.Background(), dbPath, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	runs, err := db.JobRuns(context.Background(), job, 0)
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(runs)
	return runs
}

// leaseKey returns the Redis key of the jobs lease, once one is held.
func leaseKey(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	keys, err := rdb.Keys(context.Background(), "backstop:jobs:leader:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("jobs lease keys %v (%v), want one", keys, err)
	}
	return keys[0]
}

// A scheduled sync in the middle of its pages, on three serve processes:
// its leader losing the lease to another holder stops it at once, says so
// and stores it as interrupted with the reason; Redis stopped under it
// stops it within the lease, and says so; the leader SIGKILLed, another
// process takes over within the lease and finishes the sync from the
// saved cursor. Never do two processes run it at once.
func TestFleetScheduledSyncMidRun(t *testing.T) {
	t.Parallel()
	const (
		lease = 3 * time.Second
		every = 2 * time.Second
	)
	rds := redistest.Start(t)
	s := sim.New(sim.Options{Seed: 11, Objects: 6000, Limit: 20, Window: time.Second})
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "shared.db")
	cfg := writeSlowSyncConfig(t, dir, newSimServer(t, s), dbPath, rds.URL(), lease, every)
	env := []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}
	var procs []*fleetProc
	for i := range 3 {
		p := startProc(t, fmt.Sprintf("mid-%d", i), cfg, s.APIKey(), env, "--log-level", "debug", "serve")
		p.waitCount("msg=serving", 1, 30*time.Second)
		procs = append(procs, p)
	}
	rdb := redis.NewClient(&redis.Options{Addr: rds.Addr()})
	defer rdb.Close()
	const (
		pageLine   = "page committed"
		notLeader  = "job stopped: this process is no longer the jobs leader"
		lockLost   = "job stopped: its lock was lost"
		startedRun = "job started"
	)

	// 1. The lease taken by another holder mid-run.
	leader := awaitLeader(t, procs, 10*time.Second)
	leader.waitCount(pageLine, leader.count(pageLine)+3, time.Minute)
	key := leaseKey(t, rdb)
	if err := rdb.Set(context.Background(), key, "intruder:1:0", lease).Err(); err != nil {
		t.Fatal(err)
	}
	leader.waitCount(notLeader, 1, lease)
	// The newest run that ran: a tick that came as it was stopping is
	// stored as skipped after it.
	runs := jobRuns(t, dbPath, "slow")
	runs = slices.DeleteFunc(runs, func(r store.JobRun) bool { return r.Status == "skipped" })
	if last := runs[len(runs)-1]; last.Status != "interrupted" || !strings.Contains(last.Error, "the jobs lease was lost") {
		t.Errorf("run after the lease was lost: %s %q, want interrupted, saying it no longer leads", last.Status, last.Error)
	}

	// 2. Redis stopped mid-run, then back (empty).
	runner := awaitRunning(t, procs, startedRun, jobDone, "after the intruder's lease")
	runner.waitCount(pageLine, runner.count(pageLine)+3, time.Minute)
	stoppedBefore := runner.count(notLeader) + runner.count(lockLost)
	rds.Stop()
	runner.waitCount("jobs lease: lost (Redis unreachable)", 1, 2*lease)
	deadline := time.Now().Add(2*lease + 5*time.Second)
	for runner.count(notLeader)+runner.count(lockLost) == stoppedBefore {
		if time.Now().After(deadline) {
			t.Fatalf("%s: Redis down, and the sync did not stop:\n%s", runner.name, runner.output())
		}
		time.Sleep(20 * time.Millisecond) // polling the logs, with a deadline
	}
	rds.Restart()

	// 3. The leader SIGKILLed mid-run: another finishes the sync.
	leader = awaitRunning(t, procs, startedRun, jobDone, "after Redis came back")
	leader.waitCount(pageLine, leader.count(pageLine)+3, time.Minute)
	if err := leader.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	leader.wait(10 * time.Second)
	rest := slices.DeleteFunc(slices.Clone(procs), func(p *fleetProc) bool { return p == leader })
	leadsBefore := totalCount(rest, leaderLine)
	deadline = killed.Add(lease + lease/3 + 5*time.Second)
	for totalCount(rest, leaderLine) == leadsBefore {
		if time.Now().After(deadline) {
			t.Fatalf("no survivor took the lease within %s of the SIGKILL", deadline.Sub(killed))
		}
		time.Sleep(20 * time.Millisecond) // polling the logs, with a deadline
	}
	t.Logf("a survivor took over %s after the SIGKILL", time.Since(killed).Round(time.Millisecond))
	deadline = time.Now().Add(2 * time.Minute)
	for !strings.Contains(strings.Join([]string{rest[0].output(), rest[1].output()}, "\n"), "job=slow kind=sync status=ok") {
		if time.Now().After(deadline) {
			t.Fatalf("the sync did not finish after the takeover:\n%s\n%s", rest[0].output(), rest[1].output())
		}
		time.Sleep(50 * time.Millisecond) // polling the logs, with a deadline
	}

	// The store: runs never overlap but for the one killed, which the
	// next run, holding the job's lock, closed as abandoned at its start
	// (not an hour later: its heartbeat was recent). None is left running.
	runs = jobRuns(t, dbPath, "slow")
	var ran []store.JobRun
	abandoned := 0
	for _, r := range runs {
		switch r.Status {
		case "skipped":
			continue
		case "running":
			t.Errorf("run %d is still shown running after the sync finished elsewhere: %+v", r.ID, r)
		case "abandoned":
			abandoned++
			if !strings.Contains(r.Error, "lock was free") {
				t.Errorf("abandoned run %d does not say why: %q", r.ID, r.Error)
			}
		}
		ran = append(ran, r)
	}
	if abandoned != 1 {
		t.Errorf("%d runs abandoned, want the one SIGKILLed", abandoned)
	}
	for i := 1; i < len(ran); i++ {
		prev := ran[i-1]
		if prev.Status != "abandoned" && ran[i].StartedAt.Before(prev.FinishedAt) {
			t.Errorf("run %d (%s) started at %s, before run %d (%s) finished at %s",
				ran[i].ID, ran[i].Status, ran[i].StartedAt.Format(time.StampMilli), prev.ID, prev.Status, prev.FinishedAt.Format(time.StampMilli))
		}
	}
	for _, r := range ran {
		t.Logf("run %d: %s %s..%s %q", r.ID, r.Status, r.StartedAt.Format(time.StampMilli), r.FinishedAt.Format(time.StampMilli), r.Error)
	}
}

// Three serve processes started at the same instant on a new store (a
// deployment rolling them out together): all of them serve, they agree on
// the store's identity, so exactly one leads and runs the job, and the
// others say which process does.
func TestFleetServesStartingAtOnce(t *testing.T) {
	t.Parallel()
	const (
		lease = 3 * time.Second
		every = 2 * time.Second
	)
	rds := redistest.Start(t)
	s := sim.New(sim.Options{Seed: 9, Objects: 10})
	dir := t.TempDir()
	cfg := writeTickConfig(t, dir, newSimServer(t, s), filepath.Join(dir, "new.db"), rds.URL(), lease, every)
	env := []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}
	var procs []*fleetProc
	for i := range 3 {
		procs = append(procs, startProc(t, fmt.Sprintf("once-%d", i), cfg, s.APIKey(), env, "serve"))
	}
	for _, p := range procs {
		p.waitCount("msg=serving", 1, 30*time.Second)
	}
	leader := awaitLeader(t, procs, 10*time.Second)
	leader.waitCount(jobDone, 2, 30*time.Second)
	if got := fleetLeaders(t, procs, 10*time.Second); got != leader {
		t.Fatalf("%s logged that it leads, /metrics says %s does", leader.name, got.name)
	}
	rdb := redis.NewClient(&redis.Options{Addr: rds.Addr()})
	defer rdb.Close()
	leaseKey(t, rdb) // one lease: one store identity
	for _, p := range procs {
		if p == leader {
			continue
		}
		if p.count(jobDone) != 0 {
			t.Errorf("%s ran the job while %s led", p.name, leader.name)
		}
		if p.count("jobs run by another process: lease held by") != 1 {
			t.Errorf("%s did not say once which process leads:\n%s", p.name, p.output())
		}
	}
}
