package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/internal/redistest"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// fleetProc is one of several backstop processes run by a test, its stderr
// collected line by line.
type fleetProc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd

	mu     sync.Mutex
	lines  []string
	notify chan struct{} // signalled (without blocking) on every line
	eof    chan struct{} // closed once stderr is drained
}

// startProc runs the real binary with config and args, BOTIX_API_KEY set
// to key and the extra environment; it is killed when the test ends.
func startProc(t *testing.T, name, config, key string, extraEnv []string, args ...string) *fleetProc {
	t.Helper()
	cmd := exec.Command(binPath, append([]string{"--config", config}, args...)...)
	cmd.Env = append(append(os.Environ(), "BOTIX_API_KEY="+key, "BACKSTOP_CONFIG="), extraEnv...)
	cmd.Stdout = io.Discard
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &fleetProc{t: t, name: name, cmd: cmd, notify: make(chan struct{}, 1), eof: make(chan struct{})}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-p.eof
			cmd.Wait()
		}
	})
	go func() {
		defer close(p.eof)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
			select {
			case p.notify <- struct{}{}:
			default:
			}
		}
	}()
	return p
}

// count returns how many lines so far contain substr.
func (p *fleetProc) count(substr string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.lines {
		if strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

// first returns the first line containing substr.
func (p *fleetProc) first(substr string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.lines {
		if strings.Contains(l, substr) {
			return l, true
		}
	}
	return "", false
}

// output returns the lines so far, for failure messages.
func (p *fleetProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// waitCount waits until n lines contain substr, failing the test after
// within or when the process ends first.
func (p *fleetProc) waitCount(substr string, n int, within time.Duration) {
	p.t.Helper()
	timeout := time.After(within)
	for p.count(substr) < n {
		select {
		case <-p.notify:
		case <-p.eof:
			if p.count(substr) < n {
				p.t.Fatalf("%s ended after %d of %d %q lines:\n%s", p.name, p.count(substr), n, substr, p.output())
			}
		case <-timeout:
			p.t.Fatalf("%s: saw %d of %d %q lines in %s:\n%s", p.name, p.count(substr), n, substr, within, p.output())
		}
	}
}

// wait waits for the process to exit and returns its exit code.
func (p *fleetProc) wait(within time.Duration) int {
	p.t.Helper()
	select {
	case <-p.eof:
	case <-time.After(within):
		p.t.Fatalf("%s still running after %s:\n%s", p.name, within, p.output())
	}
	p.cmd.Wait()
	return p.cmd.ProcessState.ExitCode()
}

var servingAddr = regexp.MustCompile(`msg=serving addr=http://(\S+)`)

// metrics scrapes a serve process's /metrics into name → value (labels
// included in the name).
func (p *fleetProc) metrics() map[string]float64 {
	p.t.Helper()
	line, ok := p.first("msg=serving")
	m := servingAddr.FindStringSubmatch(line)
	if !ok || m == nil {
		p.t.Fatalf("%s: no serving line with its address:\n%s", p.name, p.output())
	}
	resp, err := http.Get("http://" + m[1] + "/metrics")
	if err != nil {
		p.t.Fatalf("%s: metrics: %v", p.name, err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		if f, err := strconv.ParseFloat(val, 64); err == nil {
			out[name] = f
		}
	}
	return out
}

// writeFile writes a configuration file into dir and returns its path.
func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// quotaLimit and quotaWindow are the sim's limit in the multi-process
// tests: like TestBackfillMirrorsPlatformWithinQuota, 100 requests per 4 s
// window, slow enough that a loaded CI machine does not leave quota unused.
const (
	quotaLimit  = 100
	quotaWindow = 4 * time.Second
)

// backfillConfig is a configuration for one of several processes on one
// sim key: its own database, the tariff of the sim, and redisURL ("" for
// none).
func backfillConfig(t *testing.T, dir, name, baseURL, redisURL string) string {
	t.Helper()
	gov := ""
	if redisURL != "" {
		gov = "governor:\n  redis: " + redisURL + "\n"
	}
	return writeFile(t, dir, name+".yaml", fmt.Sprintf(`source:
  base_url: %s
  api_key: ${BOTIX_API_KEY}
  page_size: 16
  retry_max: 3
  rate_limit: {per_minute: %d, reserve: 2, window: %s}
store:
  path: %s
%s`, baseURL, int(time.Minute/quotaWindow)*quotaLimit, quotaWindow, filepath.Join(dir, name+".db"), gov))
}

// fourBackfills runs four processes, each backfilling one resource, against
// one sim key, sharing the budget through redisURL ("" for none), and
// returns the sim's counts.
func fourBackfills(t *testing.T, redisURL string) sim.Stats {
	t.Helper()
	s := sim.New(sim.Options{Seed: 23, Objects: 5000, Limit: quotaLimit, Window: quotaWindow, BigObjects: -1})
	srv := newSimServer(t, s)
	dir := t.TempDir()
	var procs []*fleetProc
	for _, r := range backstop.Resources {
		cfg := backfillConfig(t, dir, string(r), srv, redisURL)
		procs = append(procs, startProc(t, string(r), cfg, s.APIKey(), nil, "backfill", string(r)))
	}
	for _, p := range procs {
		if code := p.wait(5 * time.Minute); code != 0 {
			t.Fatalf("%s: exit %d\n%s", p.name, code, p.output())
		}
	}
	return s.Stats()
}

// quotaUsed is the share of the limit used over the full windows of st:
// all but the first and the last, which the run covers only in part.
func quotaUsed(t *testing.T, st sim.Stats) (share float64, full int) {
	t.Helper()
	if len(st.Windows) < 12 {
		t.Fatalf("the run spanned %d windows, want at least 10 full ones", len(st.Windows))
	}
	used := 0
	for _, w := range st.Windows[1 : len(st.Windows)-1] {
		used += w.Requests
	}
	full = len(st.Windows) - 2
	return float64(used) / float64(full*quotaLimit), full
}

// Four processes, each backfilling one resource against one key, share
// its budget through Redis: at most one 429 per 1,000 requests, and at
// least 90% of the quota used. The same run without Redis is reported.
func TestSharedGovernorFourProcessesOneKey(t *testing.T) {
	t.Parallel()
	rds := redistest.Start(t)
	var shared, local sim.Stats
	t.Run("runs", func(t *testing.T) {
		t.Run("redis", func(t *testing.T) {
			t.Parallel()
			shared = fourBackfills(t, rds.URL())
		})
		t.Run("without-redis", func(t *testing.T) {
			t.Parallel()
			local = fourBackfills(t, "")
		})
	})
	if t.Failed() {
		return
	}
	share, full := quotaUsed(t, shared)
	t.Logf("with Redis: %d requests, %d × 429, %.1f%% of the quota used over %d full windows",
		shared.Requests, shared.RateLimited, 100*share, full)
	t.Logf("without Redis (each process paced alone): %d requests, %d × 429", local.Requests, local.RateLimited)
	if allowed := shared.Requests / 1000; shared.RateLimited > allowed {
		t.Errorf("with Redis the platform answered %d × 429 to %d requests, want at most %d (1 per 1,000)",
			shared.RateLimited, shared.Requests, allowed)
	}
	if share < 0.90 {
		t.Errorf("with Redis %.1f%% of the quota was used over the full windows, want at least 90%%", 100*share)
	}
}

// Redis unreachable when a command starts: a clear error naming the server
// (never its password), exit 2.
func TestRedisUnreachableAtStartExits2(t *testing.T) {
	rds := redistest.Start(t)
	rds.Stop()
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 10}})
	base, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	const password = "hunter2-redis"
	e.writeConfig(string(base) + "governor:\n  redis: redis://:" + password + "@" + rds.Addr() + "/0\n")
	code, _, stderr := e.run(context.Background(), "sync", "contacts")
	if code != exitUsage {
		t.Fatalf("exit %d, want 2\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "governor.redis") || !strings.Contains(stderr, rds.Addr()) || !strings.Contains(stderr, "unreachable") {
		t.Errorf("the error does not name governor.redis, the server and the cause:\n%s", stderr)
	}
	if strings.Contains(stderr, password) {
		t.Errorf("the Redis password leaked:\n%s", stderr)
	}
	if e.sim.Stats().Requests != 0 {
		t.Errorf("%d requests were made without the shared budget", e.sim.Stats().Requests)
	}

	// Commands that only read work while Redis is down: an operator in an
	// incident can still list the jobs and the deliveries (of a database
	// that exists: these commands do not create one).
	e.openStore().Close()
	for _, args := range [][]string{{"jobs"}, {"deliveries", "list"}, {"cursors"}} {
		if code, _, stderr := e.run(context.Background(), args...); code != exitOK {
			t.Errorf("%s with Redis down: exit %d, want 0\n%s", strings.Join(args, " "), code, stderr)
		}
	}
}

// newSimServer serves s over HTTP for the test and returns its URL.
func newSimServer(t *testing.T, s *sim.Sim) string {
	t.Helper()
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

// waitRequests polls the sim until it has answered n requests.
func waitRequests(t *testing.T, s *sim.Sim, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for s.Stats().Requests < n {
		if time.Now().After(deadline) {
			t.Fatalf("the sim answered %d of %d requests in %s", s.Stats().Requests, n, within)
		}
		time.Sleep(20 * time.Millisecond) // polling the sim's counter, with a deadline
	}
}

// Redis stopped in the middle of a run of four processes on one key (three
// backfills and a serve reconciling in a job): every process goes on at its
// fallback share, without a 429 storm, and back to Redis once it returns;
// the backfills complete, and serve's /metrics shows the fallback.
func TestSharedGovernorSurvivesRedisLoss(t *testing.T) {
	t.Parallel()
	rds := redistest.Start(t)
	s := sim.New(sim.Options{Seed: 29, Objects: 2000, Limit: quotaLimit, Window: quotaWindow, BigObjects: -1})
	simURL := newSimServer(t, s)
	dir := t.TempDir()
	resources := []backstop.Resource{backstop.Contacts, backstop.Chats, backstop.Messages}
	serveCfg := writeFile(t, dir, "serve.yaml", fmt.Sprintf(`source:
  base_url: %s
  api_key: ${BOTIX_API_KEY}
  page_size: 16
  rate_limit: {per_minute: %d, reserve: 2, window: %s}
store:
  path: %s
governor:
  redis: %s
  fallback_share: 0.25
  # A job's first lock in a fresh Redis waits one lease (see
  # RedisJobLocks.fence): a short one, for a short test.
  job_lease: 5s
intake:
  listen: 127.0.0.1:0
  secret: ${BOTIX_WEBHOOK_SECRET}
jobs:
  - {name: payments-full, kind: reconcile, resources: [payments], full: true, every: 1s}
`, simURL, int(time.Minute/quotaWindow)*quotaLimit, quotaWindow, filepath.Join(dir, "serve.db"), rds.URL()))
	serve := startProc(t, "serve", serveCfg, s.APIKey(), []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}, "serve")
	serve.waitCount("msg=serving", 1, 30*time.Second)
	// The job's first run, which waits a lease for its first lock in this
	// Redis, has begun before the backfills start, so that they are still
	// going when Redis stops.
	serve.waitCount("job started", 1, 30*time.Second)
	var backfills []*fleetProc
	for _, r := range resources {
		cfg := backfillConfig(t, dir, string(r), simURL, rds.URL())
		backfills = append(backfills, startProc(t, string(r), cfg, s.APIKey(), nil, "backfill", string(r)))
	}
	all := append(slices.Clone(backfills), serve)

	waitRequests(t, s, 100, time.Minute)
	// serve calls the platform only from its job, and starts no run while
	// Redis is down (no lease): stop Redis while a run is going, so that
	// serve has requests to pace locally.
	deadline := time.Now().Add(time.Minute)
	for serve.count("job started") <= serve.count(jobDone) {
		if time.Now().After(deadline) {
			t.Fatalf("serve started no job run in a minute:\n%s", serve.output())
		}
		time.Sleep(5 * time.Millisecond) // polling the log, with a deadline
	}
	rds.Stop()
	stoppedAt := s.Stats().Requests
	for _, p := range all {
		p.waitCount("pacing locally", 1, 30*time.Second)
	}
	if m := serve.metrics(); m["backstop_governor_fallback_active"] != 1 || m["backstop_governor_fallbacks_total"] < 1 {
		t.Errorf("serve's metrics while Redis is down: fallback_active=%v fallbacks_total=%v, want 1 and at least 1",
			m["backstop_governor_fallback_active"], m["backstop_governor_fallbacks_total"])
	}
	// Long enough to cross a window boundary on local pacing alone.
	waitRequests(t, s, stoppedAt+150, time.Minute)
	rds.Restart()
	for _, p := range all {
		p.waitCount("reachable again", 1, 30*time.Second)
	}

	for i, p := range backfills {
		if code := p.wait(3 * time.Minute); code != 0 {
			t.Fatalf("%s: exit %d\n%s", p.name, code, p.output())
		}
		if p.count("paced locally while Redis was unreachable") != 1 {
			t.Errorf("%s does not report its local pacing at the end:\n%s", p.name, p.output())
		}
		db, err := store.Open(context.Background(), filepath.Join(dir, string(resources[i])+".db"), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		n, err := db.Count(context.Background(), resources[i])
		db.Close()
		if err != nil || n != len(s.Objects(resources[i])) {
			t.Errorf("%s: mirror holds %d objects (%v), want %d", p.name, n, err, len(s.Objects(resources[i])))
		}
	}
	m := serve.metrics()
	t.Logf("serve: fallbacks_total=%v fallback_requests_total=%v fallback_active=%v",
		m["backstop_governor_fallbacks_total"], m["backstop_governor_fallback_requests_total"], m["backstop_governor_fallback_active"])
	if m["backstop_governor_fallbacks_total"] < 1 || m["backstop_governor_fallback_requests_total"] < 1 || m["backstop_governor_fallback_active"] != 0 {
		t.Errorf("serve's metrics after Redis came back do not show one fallback with local requests, now over")
	}
	st := s.Stats()
	t.Logf("%d requests, %d × 429, %d of them after Redis stopped", st.Requests, st.RateLimited, st.Requests-stoppedAt)
	if st.RateLimited > 3 {
		t.Errorf("the platform answered %d × 429: a storm while Redis was away", st.RateLimited)
	}
	if err := serve.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := serve.wait(time.Minute); code != 0 {
		t.Errorf("serve: exit %d after SIGTERM\n%s", code, serve.output())
	}
}

// dialCounter is a go-redis hook that counts the client's dials, each
// attempt of the pool's included.
type dialCounter struct{ n atomic.Int64 }

func (d *dialCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.n.Add(1)
		return next(ctx, network, addr)
	}
}

func (d *dialCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (d *dialCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// The request that finds Redis gone mid-run gives up on it after one dial
// per try, and the governor paces it locally: go-redis's default dials
// five times, 100 ms apart (0.8 s for a refused connection, five dial
// timeouts for a host that does not answer).
func TestRedisGoneFailsAfterOneDialPerTry(t *testing.T) {
	rds := redistest.Start(t)
	rdb, err := connectRedis(context.Background(), rds.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	dials := &dialCounter{}
	rdb.AddHook(dials)
	rds.Stop()
	if err := rdb.Get(context.Background(), "k").Err(); err == nil || errors.Is(err, redis.Nil) {
		t.Fatalf("GET with Redis stopped: %v, want a connection error", err)
	}
	// Two tries (MaxRetries 1): the pooled connection, dead, then one dial.
	if n := dials.n.Load(); n < 1 || n > 2 {
		t.Errorf("%d dials for one command with Redis stopped, want 1 or 2", n)
	}
}
