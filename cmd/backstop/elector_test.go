package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/internal/redistest"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

const (
	leaderLine = "this process is the jobs leader"
	jobDone    = "job finished"
)

// awaitLeader polls the processes' logs until exactly one of them has
// become the jobs leader, and returns it.
func awaitLeader(t *testing.T, procs []*fleetProc, within time.Duration) *fleetProc {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var leaders []*fleetProc
		for _, p := range procs {
			if p.count(leaderLine) > 0 {
				leaders = append(leaders, p)
			}
		}
		switch {
		case len(leaders) > 1:
			t.Fatalf("%s and %s both became the jobs leader", leaders[0].name, leaders[1].name)
		case len(leaders) == 1:
			return leaders[0]
		case time.Now().After(deadline):
			t.Fatalf("no process became the jobs leader in %s", within)
		}
		time.Sleep(20 * time.Millisecond) // polling the logs, with a deadline
	}
}

// writeTickConfig writes dir/schedules.yaml for serve against the source at
// baseURL, with its store at dbPath, the job lease (of length lease) taken
// in the Redis at redisURL, and one maintenance job, tick, run every every;
// it returns the file's path.
func writeTickConfig(t *testing.T, dir, baseURL, dbPath, redisURL string, lease, every time.Duration) string {
	t.Helper()
	return writeFile(t, dir, "schedules.yaml", fmt.Sprintf(`source:
  base_url: %s
  api_key: ${BOTIX_API_KEY}
store:
  path: %s
governor:
  redis: %s
  job_lease: %s
intake:
  listen: 127.0.0.1:0
  secret: ${BOTIX_WEBHOOK_SECRET}
jobs:
  - {name: tick, kind: maintenance, every: %s}
`, baseURL, dbPath, redisURL, lease, every))
}

// startServes starts n serve processes on config, named prefix0,
// prefix1, ..., each once the one before it is serving.
func startServes(t *testing.T, prefix string, n int, config, key string, env []string) []*fleetProc {
	t.Helper()
	var procs []*fleetProc
	for i := range n {
		// One at a time, so that they do not race to migrate the new store.
		p := startProc(t, fmt.Sprintf("%s%d", prefix, i), config, key, env, "serve")
		p.waitCount("msg=serving", 1, 30*time.Second)
		procs = append(procs, p)
	}
	return procs
}

// Three serve processes with one job every 2 s on one Redis: only the
// leader runs it, once per tick; SIGKILLed, another takes over within the
// lease and goes on running it once per tick.
func TestJobsRunOnceAcrossServeProcesses(t *testing.T) {
	t.Parallel()
	const (
		lease = 3 * time.Second
		every = 2 * time.Second
	)
	rds := redistest.Start(t)
	s := sim.New(sim.Options{Seed: 5, Objects: 10})
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "shared.db")
	cfg := writeTickConfig(t, dir, newSimServer(t, s), dbPath, rds.URL(), lease, every)
	env := []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}
	procs := startServes(t, "serve-", 3, cfg, s.APIKey(), env)

	leader := awaitLeader(t, procs, 10*time.Second)
	leader.waitCount(jobDone, 5, 30*time.Second)
	for _, p := range procs {
		want := 0.0
		if p == leader {
			want = 1
		}
		if got := p.metrics()["backstop_jobs_leader"]; got != want {
			t.Errorf("%s: backstop_jobs_leader = %v, want %v", p.name, got, want)
		}
		if p != leader && p.count(jobDone) != 0 {
			t.Errorf("%s ran the job %d times while %s led", p.name, p.count(jobDone), leader.name)
		}
	}

	if err := leader.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	leader.wait(10 * time.Second)
	rest := slices.DeleteFunc(slices.Clone(procs), func(p *fleetProc) bool { return p == leader })
	next := awaitLeader(t, rest, 2*lease)
	took := time.Since(killed)
	t.Logf("%s took over from %s %s after the SIGKILL (lease %s)", next.name, leader.name, took.Round(time.Millisecond), lease)
	// The lease ends at most lease after its last renewal (at or before the
	// kill), and the survivors ask for it every lease/3; two seconds more
	// for a loaded machine (three serve processes under -race beside the
	// other packages' tests).
	if limit := lease + lease/3 + 2*time.Second; took > limit {
		t.Errorf("takeover took %s, want within %s", took, limit)
	}
	next.waitCount(jobDone, 3, 30*time.Second)
	for _, p := range rest {
		if p != next && p.count(jobDone) != 0 {
			t.Errorf("%s ran the job %d times, want none: it never led", p.name, p.count(jobDone))
		}
	}

	// The shared store holds one run per tick: consecutive runs are about a
	// tick apart (never two in one tick), but for the takeover. A run's
	// start can lag its tick on a loaded machine, so the bounds are wide;
	// two processes running the job would also double the count of runs.
	db, err := store.Open(context.Background(), dbPath, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	runs, err := db.JobRuns(context.Background(), "tick", 0)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	logged := 0
	for _, p := range procs {
		logged += p.count(jobDone)
	}
	// A run stored by the leader just before the kill may lack its log line.
	if len(runs) < logged || len(runs) > logged+1 {
		t.Errorf("%d runs stored, %d logged as finished", len(runs), logged)
	}
	slices.Reverse(runs) // oldest first
	if span := runs[len(runs)-1].StartedAt.Sub(runs[0].StartedAt); len(runs) > int(span/every)+2 {
		t.Errorf("%d runs in %s: more than one per %s tick", len(runs), span.Round(time.Millisecond), every)
	}
	long := 0
	for i := 1; i < len(runs); i++ {
		gap := runs[i].StartedAt.Sub(runs[i-1].StartedAt)
		switch {
		case gap < every/4:
			t.Errorf("runs %d and %d started %s apart: the job ran twice in one tick", i-1, i, gap)
		case gap > 2*every:
			long++
		}
		if runs[i].Status != "ok" {
			t.Errorf("run %d: status %s", i, runs[i].Status)
		}
	}
	if long > 1 {
		t.Errorf("%d gaps longer than 2 ticks between runs, want at most the takeover's", long)
	}

	for _, p := range rest {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range rest {
		if code := p.wait(time.Minute); code != 0 {
			t.Errorf("%s: exit %d after SIGTERM\n%s", p.name, code, p.output())
		}
	}
}

// A serve with no jobs (one that only takes webhooks, beside the one that
// runs the jobs) took the jobs lease when it started first, and the jobs
// never ran while it lived, without a word. It no longer asks for the
// lease: the serve with the jobs leads and runs them.
func TestServeWithoutJobsDoesNotTakeTheJobsLease(t *testing.T) {
	t.Parallel()
	const lease, every = 3 * time.Second, time.Second
	rds := redistest.Start(t)
	s := sim.New(sim.Options{Seed: 5, Objects: 10})
	base := newSimServer(t, s)
	dbPath := filepath.Join(t.TempDir(), "shared.db")
	withJobs := writeTickConfig(t, t.TempDir(), base, dbPath, rds.URL(), lease, every)
	cfg, err := os.ReadFile(withJobs)
	if err != nil {
		t.Fatal(err)
	}
	intakeOnly := writeFile(t, t.TempDir(), "schedules.yaml", strings.Split(string(cfg), "jobs:")[0])
	env := []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}
	first := startServes(t, "intake-", 1, intakeOnly, s.APIKey(), env)
	second := startServes(t, "jobs-", 1, withJobs, s.APIKey(), env)
	leader := awaitLeader(t, append(first, second...), 10*time.Second)
	if leader != second[0] {
		t.Fatalf("%s, with no jobs, became the jobs leader", leader.name)
	}
	leader.waitCount(jobDone, 2, 30*time.Second)
	if got := first[0].metrics()["backstop_jobs_leader"]; got != 0 {
		t.Errorf("the serve without jobs: backstop_jobs_leader = %v, want 0", got)
	}
}
