package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	stdsync "sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-sync/backstop/cmd/backstop/config"
	"github.com/backstop-sync/backstop/internal/redistest"
	"github.com/backstop-sync/backstop/sinks/delivery"
	"github.com/backstop-sync/backstop/sources/governor"
	"github.com/backstop-sync/backstop/store"
)

// bucketTarget answers like Discord: a fixed bucket of limit requests per
// window, X-RateLimit-Remaining and X-RateLimit-Reset-After on every answer,
// 429 past the limit.
type bucketTarget struct {
	mu        stdsync.Mutex
	limit     int
	window    time.Duration
	start     time.Time
	used      int
	ok, over  int
	delivered map[string]bool
	arrivals  []time.Time
}

func (b *bucketTarget) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	b.arrivals = append(b.arrivals, now)
	if now.Sub(b.start) >= b.window {
		b.start, b.used = now, 0
	}
	after := b.window - now.Sub(b.start)
	w.Header().Set("X-RateLimit-Limit", fmt.Sprint(b.limit))
	w.Header().Set("X-RateLimit-Reset-After", fmt.Sprintf("%.3f", after.Seconds()))
	if b.used >= b.limit {
		b.over++
		w.Header().Set("X-RateLimit-Remaining", "0")
		w.Header().Set("Retry-After", fmt.Sprintf("%.0f", after.Seconds()+0.5))
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	b.used++
	b.ok++
	b.delivered[r.Header.Get("X-Event-Id")] = true
	w.Header().Set("X-RateLimit-Remaining", fmt.Sprint(b.limit-b.used))
	w.WriteHeader(http.StatusOK)
}

// plainTarget answers 200 to every delivery without rate-limit headers,
// and keeps when each request arrived.
type plainTarget struct {
	mu        stdsync.Mutex
	delivered map[string]bool
	arrivals  []time.Time
}

func (p *plainTarget) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.arrivals = append(p.arrivals, time.Now())
	p.delivered[r.Header.Get("X-Event-Id")] = true
	w.WriteHeader(http.StatusOK)
}

// deliverPaced queues n events for target and runs the real dispatcher,
// paced by targetPacers, with up to concurrency requests in flight, until
// delivered reports all n (read under mu).
func deliverPaced(t *testing.T, target config.Target, url string, concurrency, n int, mu *stdsync.Mutex, delivered map[string]bool) {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "p.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for i := range n {
		if _, err := db.Enqueue(context.Background(), target.Name, fmt.Sprintf("evt_%d", i), "alert", []byte(`{"content":"hi"}`), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	d, err := delivery.New(deliveryQueue{db}, []delivery.Target{{Name: target.Name, URL: url, AllowPrivate: true,
		Concurrency: concurrency, RetrySchedule: []time.Duration{time.Second}}},
		delivery.Options{Poll: 20 * time.Millisecond, Pacers: targetPacers([]config.Target{target}, nil, slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	waitFor(t, time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(delivered) == n
	})
}

// checkRate fails t when more requests arrived within some span of k
// seconds (k = 1..4) than perSecond·(k+1)+1: the governor's windows are
// fixed, so a span of k seconds overlaps at most k+1 of them, and one more
// allows for a request that took long to arrive. Going faster than
// perSecond trips it; a slow, loaded machine never does.
func checkRate(t *testing.T, arrivals []time.Time, perSecond int) {
	t.Helper()
	slices.SortFunc(arrivals, time.Time.Compare)
	t.Logf("%d requests in %v", len(arrivals), arrivals[len(arrivals)-1].Sub(arrivals[0]))
	for k := 1; k <= 4; k++ {
		span := time.Duration(k) * time.Second
		most, j := 0, 0
		for i := range arrivals {
			for arrivals[i].Sub(arrivals[j]) >= span {
				j++
			}
			most = max(most, i-j+1)
		}
		if want := perSecond*(k+1) + 1; most > want {
			t.Errorf("%d requests within %v, want at most %d at %d per second", most, span, want, perSecond)
		}
	}
}

// A target that sends no rate-limit headers is held to its rate_limit:
// the governor counts its answers against the configured rate.
func TestTargetRateLimitWithoutHeaders(t *testing.T) {
	plain := &plainTarget{delivered: map[string]bool{}}
	srv := httptest.NewServer(plain)
	defer srv.Close()
	deliverPaced(t, config.Target{Name: "crm", RateLimit: config.TargetRateLimit{PerSecond: 5}}, srv.URL, 4, 40, &plain.mu, plain.delivered)
	plain.mu.Lock()
	defer plain.mu.Unlock()
	checkRate(t, plain.arrivals, 5)
}

// A target whose headers allow more than its rate_limit is still held to
// the rate_limit, and not driven into 429s.
func TestTargetRateLimitCapsGenerousHeaders(t *testing.T) {
	bucket := &bucketTarget{limit: 100, window: time.Second, start: time.Now(), delivered: map[string]bool{}}
	srv := httptest.NewServer(bucket)
	defer srv.Close()
	deliverPaced(t, config.Target{Name: "discord", RateLimit: config.TargetRateLimit{PerSecond: 5}}, srv.URL, 4, 25, &bucket.mu, bucket.delivered)
	bucket.mu.Lock()
	defer bucket.mu.Unlock()
	checkRate(t, bucket.arrivals, 5)
	if bucket.over != 0 {
		t.Errorf("the target answered 429 %d times", bucket.over)
	}
}

// A target that answers with rate-limit headers is paced by the governor:
// every event delivered, no 429 provoked.
func TestTargetPacedFromItsHeaders(t *testing.T) {
	bucket := &bucketTarget{limit: 10, window: 500 * time.Millisecond, start: time.Now(), delivered: map[string]bool{}}
	srv := httptest.NewServer(bucket)
	defer srv.Close()
	deliverPaced(t, config.Target{Name: "discord"}, srv.URL, 0, 40, &bucket.mu, bucket.delivered)
	bucket.mu.Lock()
	defer bucket.mu.Unlock()
	t.Logf("%d delivered, %d answered 429", bucket.ok, bucket.over)
	if bucket.over != 0 {
		t.Errorf("the target answered 429 %d times: pacing from its headers failed", bucket.over)
	}
}

// After 429s a target's pacer reports the pause it really holds, which
// doubles on consecutive 429s, so the dispatcher stores and logs when the
// target will be tried again rather than the answer's Retry-After alone.
func TestTargetPacerReportsItsPause(t *testing.T) {
	target := config.Target{Name: "paced", RateLimit: config.TargetRateLimit{PerSecond: 100}}
	p := targetPacers([]config.Target{target}, nil, slog.New(slog.DiscardHandler))["paced"].(delivery.PauseReporter)
	ctx := context.Background()
	rateLimited := func() {
		t.Helper()
		tk, err := p.(delivery.Pacer).Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tk.Done(http.StatusTooManyRequests, http.Header{"Retry-After": {"2"}})
	}
	rateLimited()
	first, err := p.PausedUntil(ctx)
	if err != nil || time.Until(first) < time.Second {
		t.Fatalf("after a 429 with Retry-After 2: paused until %v (%v), want about 2 s from now", first, err)
	}
	rateLimited()
	second, err := p.PausedUntil(ctx)
	if err != nil || !second.After(first) {
		t.Errorf("after a second 429: paused until %v (%v), want later than %v", second, err, first)
	}
}

// With governor.redis, a delivery to a target with a rate_limit goes
// through Redis for that cap only (a reservation and an answer: two round
// trips) until the target answers with rate-limit headers; from then on
// its own budget, learned from them, is shared too (four round trips).
func TestCappedTargetTakesTwoRedisRoundTripsPerDelivery(t *testing.T) {
	t.Parallel()
	target := cappedTestTarget() // its rate_limit never binds here: no pacing waits
	pacer, rdb, rt, ctx := redisTargetPacer(t, target)
	deliver := func(n int, h http.Header) {
		t.Helper()
		for range n {
			tk, err := pacer.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			tk.Done(http.StatusOK, h)
		}
	}
	ownBudget := targetRedisPrefix + governor.KeyID("target:"+targetKey(target))
	hasOwnBudget := func() bool {
		t.Helper()
		n, err := rdb.Exists(ctx, ownBudget).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}

	deliver(3, nil) // loads the scripts into Redis
	rt.Take()
	const n = 40
	deliver(n, nil)
	if got := rt.Load(); got > 2*n {
		t.Errorf("%d deliveries to a capped target without rate-limit headers: %d Redis round trips, want at most %d", n, got, 2*n)
	}
	if hasOwnBudget() {
		t.Error("the target's own budget is in Redis before it sent rate-limit headers")
	}

	headers := http.Header{"X-Ratelimit-Remaining": {"1000000000"}, "X-Ratelimit-Reset-After": {"60"}}
	deliver(3, headers)
	if !hasOwnBudget() {
		t.Fatal("the target's own budget is not shared in Redis after it sent rate-limit headers")
	}
	rt.Take()
	deliver(n, headers)
	if got := rt.Load(); got > 4*n {
		t.Errorf("%d deliveries to a capped target with rate-limit headers: %d Redis round trips, want at most %d", n, got, 4*n)
	}
}

// The answer that first brings a capped target's rate-limit headers also
// gives its own budget: "none left until the reset" holds the next request
// back, rather than the budget starting as if it knew nothing.
func TestCappedTargetsFirstHeadersHoldTheNextRequest(t *testing.T) {
	t.Parallel()
	pacer, _, _, ctx := redisTargetPacer(t, cappedTestTarget())
	tk, err := pacer.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tk.Done(http.StatusOK, http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset-After": {"30"}})
	wctx, wcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer wcancel()
	if tk, err := pacer.Acquire(wctx); err == nil {
		tk.Abort()
		t.Fatal("the next request was let through although the target said none was left for 30 s")
	}
}

// redisTargetPacer returns the pacer serve makes for target with
// governor.redis on a private redis-server, that client (its round trips
// counted by rt) and the context it was made with.
func redisTargetPacer(t *testing.T, target config.Target) (delivery.Pacer, *redis.Client, *redistest.RoundTrips, context.Context) {
	t.Helper()
	cfg := &config.Config{Governor: config.Governor{FallbackShare: 0.5}, Targets: []config.Target{target}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	rds := redistest.Start(t)
	rdb, err := connectRedis(ctx, rds.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	rt := &redistest.RoundTrips{}
	rdb.AddHook(rt)
	log := slog.New(slog.DiscardHandler)
	return targetPacers(cfg.Targets, targetGovernorStore(ctx, rdb, cfg, log), log)[target.Name], rdb, rt, ctx
}

// cappedTestTarget is a target whose rate_limit never binds in a test.
func cappedTestTarget() config.Target {
	return config.Target{Name: "crm", URL: "http://127.0.0.1:9/hook",
		RateLimit: config.TargetRateLimit{PerSecond: 1_000_000},
		Timeout:   config.Duration(30 * time.Second), ConnectTimeout: config.Duration(10 * time.Second)}
}
