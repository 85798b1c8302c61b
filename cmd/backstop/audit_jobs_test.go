package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite"

	"github.com/backstop-sync/backstop/internal/redistest"
	"github.com/backstop-sync/backstop/sources/sim"
	bsync "github.com/backstop-sync/backstop/sync"
)

// jobsJSON runs `backstop jobs --json` and returns the job named name.
func (e *env) jobsJSON(name string) jobRow {
	e.t.Helper()
	code, stdout, stderr := e.run(context.Background(), "jobs", "--json")
	if code != exitOK {
		e.t.Fatalf("jobs --json: exit %d\n%s", code, stderr)
	}
	var rows []jobRow
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
		e.t.Fatalf("jobs --json: %v\n%s", err, stdout)
	}
	for _, r := range rows {
		if r.Name == name {
			return r
		}
	}
	e.t.Fatalf("jobs --json lists no %s:\n%s", name, stdout)
	return jobRow{}
}

// A `backstop run JOB` killed with SIGKILL mid-run leaves its run stored
// as running (with a heartbeat), which `backstop jobs` shows; once its
// heartbeat is older than any live run's could be, maintenance closes it
// as abandoned. It used to leave no trace at all.
func TestKilledJobRunIsShownRunningThenAbandoned(t *testing.T) {
	e := newEnv(t, envOpts{
		sim:       sim.Options{Seed: 13, Objects: 1500, Limit: 60, Window: time.Second},
		perMinute: 3600, window: "1s", pageSize: 10,
	})
	e.withJobs()
	cmd, lines := e.startBinary("--log-level", "debug", "run", "crm-nightly")
	waitLines(t, lines, "page committed", 3, time.Minute)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	last := e.jobsJSON("crm-nightly").LastRun
	if last == nil || last.Status != "running" || last.FinishedAt != nil || last.HeartbeatAt == nil ||
		last.HeartbeatAt.Before(last.StartedAt) {
		t.Fatalf("backstop jobs after the kill: last run %+v, want it running with a heartbeat", last)
	}
	// It is still stored as running, but jobs knows its process is gone
	// (it said only "running" until the job ran again).
	if want := fmt.Sprintf("pid %d on host ", cmd.Process.Pid); !strings.HasPrefix(last.ProcessGone, want) {
		t.Errorf("jobs --json process_gone = %q, want %q…", last.ProcessGone, want)
	}
	if code, stdout, _ := e.run(context.Background(), "jobs"); code != exitOK || !strings.Contains(stdout, fmt.Sprintf("running? its process (pid %d on host ", cmd.Process.Pid)) {
		t.Errorf("jobs: exit %d, want the run shown running with its process gone\n%s", code, stdout)
	}
	// Right away it might be a run going on in another process:
	// maintenance leaves it.
	if code, _, stderr := e.run(context.Background(), "run", "prune"); code != exitOK {
		t.Fatalf("run prune: exit %d\n%s", code, stderr)
	}
	if last := e.jobsJSON("crm-nightly").LastRun; last == nil || last.Status != "running" {
		t.Fatalf("a run that beat moments ago was closed: %+v", last)
	}

	// Two hours later (its times moved back), maintenance closes it.
	raw, err := sql.Open("sqlite", e.db+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	old := time.Now().Add(-2 * time.Hour).UTC().Format("2006-01-02T15:04:05.000000000Z")
	if res, err := raw.Exec(`UPDATE job_runs SET heartbeat_at = ?, started_at = ? WHERE status = 'running' AND job = 'crm-nightly'`, old, old); err != nil {
		t.Fatal(err)
	} else if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("%d running runs of crm-nightly, want 1", n)
	}
	if code, _, stderr := e.run(context.Background(), "run", "prune"); code != exitOK {
		t.Fatalf("run prune: exit %d\n%s", code, stderr)
	}
	last = e.jobsJSON("crm-nightly").LastRun
	if last == nil || last.Status != "abandoned" || last.FinishedAt == nil || last.Error == "" {
		t.Errorf("killed run two hours later, after maintenance: %+v, want abandoned with its reason", last)
	}
	// The next run completes from the saved cursor.
	if code, _, stderr := e.run(context.Background(), "run", "crm-nightly"); code != exitOK {
		t.Fatalf("next run: exit %d\n%s", code, stderr)
	}
	if last := e.jobsJSON("crm-nightly").LastRun; last == nil || last.Status != "ok" {
		t.Errorf("after the next run: %+v, want ok", last)
	}
}

// serve processes of two stores on one API key and one Redis each run
// their own store's jobs: the jobs lease and the job locks are the
// store's, not the key's (a serve with its own store never ran a job
// while the other store's leader lived). Two processes on one store still
// elect one leader, and the one standing by says so once.
func TestServeOfTwoStoresOnOneKeyBothRunJobs(t *testing.T) {
	t.Parallel()
	const (
		lease = 3 * time.Second
		every = time.Second
	)
	rds := redistest.Start(t)
	s := sim.New(sim.Options{Seed: 5, Objects: 10})
	base := newSimServer(t, s)
	config := func(name string) string {
		dir := t.TempDir()
		return writeTickConfig(t, dir, base, filepath.Join(dir, name+".db"), rds.URL(), lease, every)
	}
	cfgA, cfgB := config("a"), config("b")
	env := []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}
	procsA := startServes(t, "serve-a", 2, cfgA, s.APIKey(), env)
	leaderA := awaitLeader(t, procsA, 10*time.Second)
	b := startProc(t, "serve-b", cfgB, s.APIKey(), env, "serve")
	b.waitCount("msg=serving", 1, 30*time.Second)

	// Store b's process leads its own store and runs its job while a's
	// leader lives.
	b.waitCount(leaderLine, 1, 10*time.Second)
	b.waitCount(jobDone, 3, 30*time.Second)
	leaderA.waitCount(jobDone, 3, 30*time.Second)
	if n := b.count("jobs run by another process"); n != 0 {
		t.Errorf("serve-b stood by %d times for another store's leader:\n%s", n, b.output())
	}
	for _, p := range procsA {
		if p == leaderA {
			continue
		}
		if n := p.count(jobDone); n != 0 {
			t.Errorf("%s ran the job %d times while %s led store a", p.name, n, leaderA.name)
		}
		if n := p.count("jobs run by another process: lease held by "); n != 1 {
			t.Errorf("%s logged standing by %d times over several ticks, want once:\n%s", p.name, n, p.output())
		}
	}
	for _, p := range append(procsA, b) {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range append(procsA, b) {
		if code := p.wait(time.Minute); code != 0 {
			t.Errorf("%s: exit %d after SIGTERM\n%s", p.name, code, p.output())
		}
	}
}

// runAs drives Main in-process with BOTIX_API_KEY set to key, or unset
// when key is empty, and progress bars drawn when terminal is set.
func (e *env) runAs(key string, terminal bool, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	m := &Main{
		Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, IsTerminal: terminal,
		LookupEnv: func(k string) (string, bool) {
			switch k {
			case "BOTIX_API_KEY":
				return key, key != ""
			case "BACKSTOP_CONFIG":
				return "", false
			}
			return os.LookupEnv(k)
		},
	}
	code := m.Run(context.Background(), append([]string{"--config", e.config}, args...))
	return code, out.String(), errb.String()
}

// withRedisLockHeld adds governor.redis to e's configuration and holds job's lock
// in that Redis as another process would, under the key serve uses (the
// store's id). It returns a function that releases the lock.
func (e *env) withRedisLockHeld(job string) (release func()) {
	e.t.Helper()
	rds := redistest.Start(e.t)
	e.appendConfig("governor:\n  redis: " + rds.URL() + "\n")
	db := e.openStore()
	storeID, err := db.StoreID(context.Background())
	db.Close()
	if err != nil {
		e.t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: rds.Addr()})
	e.t.Cleanup(func() { rdb.Close() })
	key := bsync.DefaultJobLockPrefix + storeID + ":" + job
	if err := rdb.Set(context.Background(), key, "another-process", time.Minute).Err(); err != nil {
		e.t.Fatal(err)
	}
	// And its record, as a holder sets it: the lock released, the next
	// run takes it at once, not one lease later (RedisJobLocks.fence).
	if err := rdb.Set(context.Background(), key+":record", "1", 0).Err(); err != nil {
		e.t.Fatal(err)
	}
	return func() {
		if err := rdb.Del(context.Background(), key).Err(); err != nil {
			e.t.Fatal(err)
		}
	}
}

// `backstop run prune` (maintenance: it never calls the platform) runs
// without BOTIX_API_KEY, and still takes its lock in Redis: held by
// another process, the run is skipped (exit 75). It used to fail with
// exit 2 (source.api_key is empty).
func TestRunMaintenanceJobWithoutAPIKey(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 3, Objects: 5}})
	e.withJobs()
	release := e.withRedisLockHeld("prune")
	code, stdout, stderr := e.runAs("", false, "run", "prune", "--json")
	if code != exitBusy || !strings.Contains(stdout, `"status": "skipped"`) {
		t.Fatalf("run prune without a key while its lock is held: exit %d, want %d and skipped\n%s%s", code, exitBusy, stdout, stderr)
	}
	release()
	code, stdout, stderr = e.runAs("", false, "run", "prune", "--json")
	if code != exitOK || !strings.Contains(stdout, `"status": "ok"`) {
		t.Fatalf("run prune without a key: exit %d, want 0 and ok\n%s%s", code, stdout, stderr)
	}
	// A job that reads the platform still needs the key.
	if code, _, stderr := e.runAs("", false, "run", "crm-nightly"); code != exitUsage || !strings.Contains(stderr, "BOTIX_API_KEY") {
		t.Errorf("run crm-nightly without a key: exit %d, want 2 naming BOTIX_API_KEY\n%s", code, stderr)
	}
}

// On a terminal, `backstop run` of a job running in another process says
// why it was skipped: the warning used to go to the progress display after
// it had shut down, and was lost.
func TestRunSkippedWarningShowsOnATerminal(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 3, Objects: 5}})
	e.withJobs()
	e.withRedisLockHeld("crm-nightly")
	code, stdout, stderr := e.runAs(e.sim.APIKey(), true, "run", "crm-nightly")
	if code != exitBusy || !strings.Contains(stdout, "skipped") {
		t.Fatalf("run while running elsewhere: exit %d, want %d and skipped\n%s%s", code, exitBusy, stdout, stderr)
	}
	if !strings.Contains(stderr, "backstop: run crm-nightly: skipped: job crm-nightly: job is still running in another process") {
		t.Errorf("the terminal does not say why the run was skipped:\n%q", stderr)
	}
}
