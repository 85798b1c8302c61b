package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	stdsync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-sync/backstop/cmd/backstop/config"
	"github.com/backstop-sync/backstop/internal/redistest"
	"github.com/backstop-sync/backstop/sources/governor"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// Three serve processes on one store and one Redis (governor.redis) deliver
// to two targets: "capped", with rate_limit per_second 10 and no rate-limit
// headers, and "paced", which publishes a bucket of 10 per second in
// X-RateLimit-* and answers 429 past it. Every process delivers to both,
// and together they hold the rate_limit (counted per second at the target)
// and drive the paced target into no 429s: the target governors share
// their budgets through Redis, as the API key's governor does, under keys
// of their own.
func TestTargetPacingSharedAcrossServeProcesses(t *testing.T) {
	t.Parallel()
	const (
		perSecond = 10
		rows      = 96 // per target: enough for every process to claim some
		procs     = 3
	)
	rds := redistest.Start(t)
	s := sim.New(sim.Options{Seed: 5, Objects: 10})
	plain := &plainTarget{delivered: map[string]bool{}}
	capped := httptest.NewServer(plain)
	defer capped.Close()
	bucket := &bucketTarget{limit: perSecond, window: time.Second, start: time.Now(), delivered: map[string]bool{}}
	paced := httptest.NewServer(bucket)
	defer paced.Close()

	dir := t.TempDir()
	dbPath := filepath.Join(dir, "shared.db")
	cfg := writeFile(t, dir, "schedules.yaml", fmt.Sprintf(`source:
  base_url: %s
  api_key: ${BOTIX_API_KEY}
store:
  path: %s
governor:
  redis: %s
intake:
  listen: 127.0.0.1:0
  secret: ${BOTIX_WEBHOOK_SECRET}
targets:
  - {name: capped, url: %q, allow_private: true, concurrency: 2, rate_limit: {per_second: %d}}
  - {name: paced, url: %q, allow_private: true, concurrency: 2}
`, newSimServer(t, s), dbPath, rds.URL(), capped.URL, perSecond, paced.URL))
	env := []string{"BOTIX_WEBHOOK_SECRET=" + webhookSecret}
	var fleet []*fleetProc
	for i := range procs {
		// One at a time, so that they do not race to migrate the new store.
		p := startProc(t, fmt.Sprintf("serve-%d", i), cfg, s.APIKey(), env, "--log-level", "debug", "serve")
		p.waitCount("msg=serving", 1, 30*time.Second)
		fleet = append(fleet, p)
	}

	// Queued by another process (as backstop sync would): every serve
	// process picks the rows up at its next look, within a second.
	db, err := store.Open(context.Background(), dbPath, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		for _, target := range []string{"capped", "paced"} {
			if _, err := db.Enqueue(context.Background(), target, fmt.Sprintf("evt_%s_%d", target, i), "alert", []byte(`{"n":1}`), time.Now()); err != nil {
				t.Fatal(err)
			}
		}
	}
	db.Close()
	waitFor(t, 2*time.Minute, func() bool {
		plain.mu.Lock()
		a := len(plain.delivered)
		plain.mu.Unlock()
		bucket.mu.Lock()
		b := len(bucket.delivered)
		bucket.mu.Unlock()
		return a == rows && b == rows
	})

	// The test means something only if the processes delivered together.
	for _, p := range fleet {
		for _, target := range []string{"capped", "paced"} {
			n := 0
			for _, l := range strings.Split(p.output(), "\n") {
				if strings.Contains(l, "msg=delivered") && strings.Contains(l, "target="+target) {
					n++
				}
			}
			t.Logf("%s delivered %d to %s", p.name, n, target)
			if n == 0 {
				t.Errorf("%s delivered nothing to %s: the processes did not share the queue", p.name, target)
			}
		}
	}

	plain.mu.Lock()
	checkRate(t, slices.Clone(plain.arrivals), perSecond)
	plain.mu.Unlock()
	bucket.mu.Lock()
	over, ok := bucket.over, bucket.ok
	bucket.mu.Unlock()
	t.Logf("paced target: %d delivered, %d answered 429", ok, over)
	// A stray 429 at a window's edge is tolerated; per-process budgets
	// drive it into one every few requests.
	if over > 2 {
		t.Errorf("the paced target answered 429 %d times (%d processes, %d per second): its budget was not shared", over, procs, perSecond)
	}

	// The target budgets live in Redis under keys of their own, apart from
	// the API key's: the capped target's rate_limit (it sends no rate-limit
	// headers, so its own budget stays out of Redis) and the paced one's
	// budget.
	rdb := redis.NewClient(&redis.Options{Addr: rds.Addr()})
	defer rdb.Close()
	keys, err := rdb.Keys(context.Background(), targetRedisPrefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Errorf("target keys in Redis: %q, want 2 under %s", keys, targetRedisPrefix)
	}
	for _, k := range keys {
		if strings.Contains(k, "capped") || strings.Contains(k, "paced") || strings.Contains(k, "127.0.0.1") {
			t.Errorf("Redis key %q names its target: want a hash", k)
		}
	}

	for _, p := range fleet {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range fleet {
		if code := p.wait(time.Minute); code != 0 {
			t.Errorf("%s: exit %d after SIGTERM\n%s", p.name, code, p.output())
		}
		if p.count("shared budget unreachable") != 0 {
			t.Errorf("%s fell back to local pacing with Redis up:\n%s", p.name, p.output())
		}
	}
}

// lockedLog is a log destination safe for concurrent writes.
type lockedLog struct {
	mu  stdsync.Mutex
	buf bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Without governor.redis the target governors keep their budgets in the
// process, as before. With it, losing Redis does not stop deliveries: a
// target's pacer paces alone at governor.fallback_share of its rate_limit,
// says so, and goes back to Redis once it answers again, found by the
// probe in the background even with no delivery to make meanwhile.
func TestTargetPacersFallBackWhileRedisIsDown(t *testing.T) {
	t.Parallel()
	cfg := &config.Config{
		Governor: config.Governor{FallbackShare: 0.5},
		Targets: []config.Target{{Name: "crm", URL: "http://127.0.0.1:9/hook", RateLimit: config.TargetRateLimit{PerSecond: 8},
			Timeout: config.Duration(30 * time.Second), ConnectTimeout: config.Duration(10 * time.Second)}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if s := targetGovernorStore(ctx, nil, cfg, slog.New(slog.DiscardHandler)); s != nil {
		t.Fatalf("without Redis: target store %T, want none (each governor its own)", s)
	}

	rds := redistest.Start(t)
	rdb, err := connectRedis(ctx, rds.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	var logs lockedLog
	st := targetGovernorStore(ctx, rdb, cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	fb, ok := st.(*governor.FallbackStore)
	if !ok {
		t.Fatalf("with Redis: target store %T, want a *governor.FallbackStore", st)
	}
	pacer := targetPacers(cfg.Targets, st, slog.New(slog.DiscardHandler))["crm"]
	send := func(d time.Duration) []time.Time {
		t.Helper()
		var sent []time.Time
		for end := time.Now().Add(d); time.Now().Before(end); {
			tk, err := pacer.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			sent = append(sent, time.Now())
			tk.Done(200, nil)
		}
		return sent
	}
	send(500 * time.Millisecond)
	if keys, _ := rdb.Keys(ctx, targetRedisPrefix+"*").Result(); len(keys) != 1 {
		t.Fatalf("target keys in Redis: %q, want its rate_limit's", keys)
	}

	rds.Stop()
	sent := send(3 * time.Second)
	if s := fb.Stats(); !s.Local || s.Fallbacks != 1 {
		t.Fatalf("with Redis down: %+v, want local pacing after 1 fallback", s)
	}
	// Half of 8 per second, in this process alone.
	checkRate(t, sent, 4)
	if !strings.Contains(logs.String(), "pacing locally") {
		t.Errorf("no \"pacing locally\" in the logs:\n%s", logs.String())
	}

	rds.Restart()
	waitFor(t, 15*time.Second, func() bool { return !fb.Stats().Local })
	if !strings.Contains(logs.String(), "reachable again") {
		t.Errorf("no \"reachable again\" in the logs:\n%s", logs.String())
	}
	send(300 * time.Millisecond)
	if keys, _ := rdb.Keys(ctx, targetRedisPrefix+"*").Result(); len(keys) != 1 {
		t.Errorf("target keys in the restarted Redis: %q, want its rate_limit's again", keys)
	}
}

// A target without a rate_limit is paced by its X-RateLimit-* headers
// only: with Redis, it costs no Redis round trip per delivery until it
// answers with such headers, and from then on its budget is shared.
func TestUncappedTargetGoesThroughRedisOnceItSendsHeaders(t *testing.T) {
	t.Parallel()
	pacer, rdb, _, ctx := redisTargetPacer(t, config.Target{Name: "crm", URL: "http://127.0.0.1:9/hook",
		Timeout: config.Duration(30 * time.Second), ConnectTimeout: config.Duration(10 * time.Second)})
	deliver := func(h http.Header) {
		t.Helper()
		tk, err := pacer.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tk.Done(http.StatusOK, h)
	}
	for range 20 {
		deliver(nil)
	}
	if keys, err := rdb.Keys(ctx, targetRedisPrefix+"*").Result(); err != nil {
		t.Fatal(err)
	} else if len(keys) != 0 {
		t.Fatalf("a target that sends no rate-limit headers has keys in Redis: %q", keys)
	}
	reset := strconv.FormatInt(time.Now().Add(time.Minute).Unix(), 10)
	deliver(http.Header{"X-Ratelimit-Remaining": {"100"}, "X-Ratelimit-Reset": {reset}})
	deliver(http.Header{"X-Ratelimit-Remaining": {"99"}, "X-Ratelimit-Reset": {reset}})
	if keys, _ := rdb.Keys(ctx, targetRedisPrefix+"*").Result(); len(keys) != 1 {
		t.Errorf("target keys in Redis once it sent rate-limit headers: %q, want its budget's", keys)
	}
}
