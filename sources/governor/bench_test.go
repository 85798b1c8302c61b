package governor_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-sync/backstop/internal/redistest"
	"github.com/backstop-sync/backstop/sources/governor"
	"github.com/backstop-sync/backstop/sources/sim"
)

// BenchmarkGovernorShared measures the Redis-shared governor against a
// private redis-server: the latency of one reservation (RedisStore against
// MemoryStore, the in-run baseline), and, with 1, 4 and 16 workers on one
// key, each a process of its own (its own RedisStore), the quota used and
// the 429s against the simulator's limit of 100 requests per 1 s window.
// It also counts the Redis round trips: per Reserve and per Observe of one
// process alone on its key (reserve_round_trips, observe_round_trips), and
// per request sent by the workers, pacing waits and lost races included
// (wN_round_trips_per_request). It prints one BENCH line.
func BenchmarkGovernorShared(b *testing.B) {
	srv := redistest.Start(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 32})
	defer rdb.Close()
	rt := &redistest.RoundTrips{}
	rdb.AddHook(rt)
	ctx := context.Background()

	var line string
	for i := 0; i < b.N; i++ {
		const n = 5000
		redisLat, reserveRT, observeRT := reserveLatency(b, governor.NewRedisStore(rdb, governor.RedisOptions{Prefix: fmt.Sprintf("bench:%d:lat:", i)}), n, rt)
		memLat, _, _ := reserveLatency(b, governor.NewMemoryStore(), n, rt)
		line = fmt.Sprintf("BENCH governor-shared reserve_p50_us=%.0f reserve_p99_us=%.0f memory_p50_us=%.2f memory_p99_us=%.2f ratio=%.0f reserve_round_trips=%.2f observe_round_trips=%.2f",
			us(pct(redisLat, 50)), us(pct(redisLat, 99)), us(pct(memLat, 50)), us(pct(memLat, 99)),
			float64(pct(redisLat, 50))/float64(max(pct(memLat, 50), 1)), reserveRT, observeRT)
		for _, workers := range []int{1, 4, 16} {
			rt.Take()
			r := workersRun(ctx, b, rdb, fmt.Sprintf("bench:%d:w%d:", i, workers), workers)
			line += fmt.Sprintf(" w%d_quota=%.2f w%d_429=%d w%d_reserve_p50_us=%.0f w%d_reserve_p99_us=%.0f w%d_round_trips_per_request=%.2f",
				workers, r.quota, workers, r.rateLimited, workers, us(pct(r.reserve, 50)), workers, us(pct(r.reserve, 99)),
				workers, float64(rt.Load())/float64(max(r.requests, 1)))
		}
	}
	fmt.Println(line)
}

// reserveLatency times n reservations on one key, each observed before the
// next so that the budget never binds, and returns the round trips rt
// counted per Reserve and per Observe.
func reserveLatency(b *testing.B, s governor.Store, n int, rt *redistest.RoundTrips) (lat []time.Duration, reserveRT, observeRT float64) {
	b.Helper()
	ctx := context.Background()
	p := governor.Policy{Limit: 1 << 30, Window: time.Minute, ResetMargin: 100 * time.Millisecond}
	lat = make([]time.Duration, 0, n)
	var reserves, observes int64
	for range n {
		now := time.Now()
		before := rt.Load()
		start := time.Now()
		_, ok, err := s.Reserve(ctx, "k", now, p)
		lat = append(lat, time.Since(start))
		if err != nil || !ok {
			b.Fatalf("reserve: %v %v", ok, err)
		}
		mid := rt.Load()
		if err := s.Observe(ctx, "k", now, governor.Observation{Status: 200, Granted: now}, p); err != nil {
			b.Fatal(err)
		}
		reserves += mid - before
		observes += rt.Load() - mid
	}
	return lat, float64(reserves) / float64(n), float64(observes) / float64(n)
}

// workersResult is what one run of workers on one key measured.
type workersResult struct {
	quota       float64 // requests counted over the full windows ÷ their limit
	rateLimited int
	requests    int             // requests sent
	reserve     []time.Duration // every Reserve call's latency
}

// workersRun runs workers governors on one sim key for eight windows, each
// with its own RedisStore as a separate process would have.
func workersRun(ctx context.Context, b *testing.B, rdb *redis.Client, prefix string, workers int) workersResult {
	b.Helper()
	const (
		limit  = 100
		window = time.Second
		run    = 8 * window
	)
	s := sim.New(sim.Options{Seed: 1, Objects: 10, Limit: limit, Window: window})
	api := httptest.NewServer(s.Handler())
	defer api.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}}

	var mu sync.Mutex
	var lat []time.Duration
	var sent atomic.Int64
	stop := time.Now().Add(run)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		store := &timedStore{Store: governor.NewRedisStore(rdb, governor.RedisOptions{Prefix: prefix})}
		g := governor.New(s.APIKey(), governor.Options{Limit: limit, Window: window, Reserve: 2, Store: store})
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				mu.Lock()
				lat = append(lat, store.lat...)
				mu.Unlock()
			}()
			for time.Now().Before(stop) {
				if err := governedGet(ctx, g, client, api.URL, s.APIKey()); err != nil {
					errs <- err
					return
				}
				sent.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	st := s.Stats()
	used := 0
	full := st.Windows[1 : len(st.Windows)-1]
	for _, w := range full {
		used += w.Requests
	}
	return workersResult{
		quota:       float64(used) / float64(len(full)*limit),
		rateLimited: st.RateLimited,
		requests:    int(sent.Load()),
		reserve:     lat,
	}
}

// governedGet makes one request of a page of contacts to the simulator at
// apiURL under g: it waits for g's grant, and reports the answer to it.
func governedGet(ctx context.Context, g *governor.Governor, client *http.Client, apiURL, apiKey string) error {
	tk, err := g.Acquire(ctx)
	if err != nil {
		return err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, apiURL+"/public/v1/contacts?cursor_limit=1", nil)
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := client.Do(req)
	if err != nil {
		tk.Abort()
		return err
	}
	resp.Body.Close()
	tk.Done(resp.StatusCode, resp.Header)
	return nil
}

// timedStore records the latency of every Reserve of one worker.
type timedStore struct {
	governor.Store
	lat []time.Duration
}

func (s *timedStore) Reserve(ctx context.Context, key string, now time.Time, p governor.Policy) (time.Duration, bool, error) {
	start := time.Now()
	wait, ok, err := s.Store.Reserve(ctx, key, now, p)
	s.lat = append(s.lat, time.Since(start))
	return wait, ok, err
}

// pct returns the q-th percentile of d.
func pct(d []time.Duration, q int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)*q/100, len(s)-1)]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
