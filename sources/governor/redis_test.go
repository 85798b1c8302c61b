package governor

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/backstop-sync/backstop/internal/redistest"
	"github.com/backstop-sync/backstop/internal/syncbuf"
)

// newRedis starts a private redis-server and returns a client of it.
func newRedis(t *testing.T) (*redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: 1, DialTimeout: time.Second, DialerRetries: 1})
	t.Cleanup(func() { rdb.Close() })
	return srv, rdb
}

// countedRedis returns a client of srv whose round trips rt counts, as the
// client of a process of its own.
func countedRedis(t *testing.T, srv *redistest.Server) (*redis.Client, *redistest.RoundTrips) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: 1, DialTimeout: time.Second, DialerRetries: 1})
	t.Cleanup(func() { rdb.Close() })
	rt := &redistest.RoundTrips{}
	rdb.AddHook(rt)
	return rdb, rt
}

// A process alone on a key spends one Redis round trip per Reserve and
// per Observe, the first on a new key included: the store computes from the
// state it last read or wrote and tries the compare-and-set at once. A
// write by another process costs one more, after which the store decides
// on that state; a flushed Redis likewise, and the state this process held
// from before is not written back over it.
func TestRedisStoreCallsTakeOneRoundTrip(t *testing.T) {
	srv, _ := newRedis(t)
	rdb, rt := countedRedis(t, srv)
	other, _ := countedRedis(t, srv)
	ctx := context.Background()
	pol := Policy{Limit: 100, Window: time.Minute, ResetMargin: 100 * time.Millisecond}
	a, b := NewRedisStore(rdb, RedisOptions{}), NewRedisStore(other, RedisOptions{})
	now := time.Unix(1_700_000_000, 0)
	// Load the scripts into Redis, and open the connection.
	if _, _, err := a.Reserve(ctx, "warm-up", now, pol); err != nil {
		t.Fatal(err)
	}
	rt.Take()

	reserve := func(s *RedisStore, at time.Time) {
		t.Helper()
		if wait, ok, err := s.Reserve(ctx, "k", at, pol); err != nil || !ok {
			t.Fatalf("reserve at %s: %v %v (wait %s)", at.Format(time.StampMilli), ok, err, wait)
		}
	}
	observe := func(s *RedisStore, at time.Time, obs Observation) {
		t.Helper()
		obs.Status, obs.Granted = 200, at
		if err := s.Observe(ctx, "k", at, obs, pol); err != nil {
			t.Fatal(err)
		}
	}
	headers := Observation{HasBudget: true, Limit: 50, Remaining: 40, Reset: now.Add(time.Minute)}
	reserve(a, now)
	if n := rt.Take(); n != 1 {
		t.Errorf("first reserve on a new key: %d round trips, want 1", n)
	}
	observe(a, now, headers)
	if n := rt.Take(); n != 1 {
		t.Errorf("observe: %d round trips, want 1", n)
	}
	const calls = 20
	for i := range calls {
		at := now.Add(time.Duration(2*i+2) * time.Second)
		reserve(a, at)
		observe(a, at, Observation{})
	}
	if n := rt.Take(); n != 2*calls {
		t.Errorf("%d reserves and observes alone on the key: %d round trips, want %d", calls, n, 2*calls)
	}

	// Another process writes: one more round trip, and the decision
	// counts its request in flight.
	reserve(b, now.Add(45*time.Second))
	at := now.Add(46 * time.Second)
	reserve(a, at)
	if n := rt.Take(); n != 2 {
		t.Errorf("reserve after another process wrote: %d round trips, want 2", n)
	}
	if st, err := a.Snapshot(ctx, "k", at, pol); err != nil || st.InFlight != 2 || st.Limit != 50 {
		t.Fatalf("state after both reserved: %+v (%v), want both requests in flight and the learned limit 50", st, err)
	}
	observe(b, now.Add(45*time.Second), Observation{})
	observe(a, at, Observation{})
	rt.Take()

	// Redis loses the key: the store's state from before (limit 50, a
	// version) is not written over the new one; the key starts afresh from
	// the seed.
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	rt.Take()
	at = now.Add(50 * time.Second)
	reserve(a, at)
	if n := rt.Take(); n > 2 {
		t.Errorf("reserve after the key was lost: %d round trips, want at most 2", n)
	}
	st, err := b.Snapshot(ctx, "k", at, pol)
	if err != nil || st.Limit != 100 || st.Learned || st.InFlight != 1 {
		t.Fatalf("state after the key was lost: %+v (%v), want the seed (limit 100, nothing learned) with 1 in flight", st, err)
	}
}

// Processes starting together on a key nobody has written each try to
// create it: one does, and the others decide on the state it wrote. The
// seed is only a guess, so exactly one request is granted (the probe that
// learns the real budget) however many processes ask at once.
func TestRedisStoreNewKeyGrantsOneProbeAmongProcesses(t *testing.T) {
	srv, _ := newRedis(t)
	const procs = 16
	pol := Policy{Limit: 100, Window: time.Minute, ResetMargin: 100 * time.Millisecond}
	now := time.Unix(1_700_000_000, 0)
	for round := range 5 {
		key := "k" + strconv.Itoa(round)
		var granted, total atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, procs)
		for range procs {
			rdb, rt := countedRedis(t, srv)
			s := NewRedisStore(rdb, RedisOptions{})
			if err := rdb.Ping(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			rt.Take()
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, ok, err := s.Reserve(context.Background(), key, now, pol)
				if err != nil {
					errs <- err
					return
				}
				if ok {
					granted.Add(1)
				}
				total.Add(rt.Take())
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if n := granted.Load(); n != 1 {
			t.Fatalf("round %d: %d of %d processes granted on a new key, want 1", round, n, procs)
		}
		t.Logf("round %d: %d round trips for %d processes", round, total.Load(), procs)
	}
}

// The Redis store must take exactly the decisions MemoryStore takes on the
// same sequence of calls, spread over two processes: the rules are
// Budget's, the store only shares them.
func TestRedisStoreDecidesLikeMemoryStore(t *testing.T) {
	_, rdb := newRedis(t)
	ctx := context.Background()
	stores := []*RedisStore{NewRedisStore(rdb, RedisOptions{}), NewRedisStore(rdb, RedisOptions{})}
	mem := NewMemoryStore()
	const key = "k1"
	pol := Policy{Limit: 20, Window: 10 * time.Second, Reserve: 2, MaxPause: 30 * time.Second, Jitter: 0.3, ResetMargin: 100 * time.Millisecond}
	srv := &fixedWindow{limit: 20, window: 10 * time.Second, counts: map[int64]int{}}

	type grant struct {
		store int
		at    time.Time
	}
	var open []grant
	rng := rand.New(rand.NewPCG(7, 7))
	now := time.Unix(1_700_000_003, 0)
	for i := range 600 {
		now = now.Add(time.Duration(rng.IntN(400)) * time.Millisecond)
		if len(open) > 0 && rng.IntN(2) == 0 {
			j := rng.IntN(len(open))
			g := open[j]
			open = slices.Delete(open, j, j+1)
			status, h := srv.hit(now)
			obs := parseHeaders(h, now)
			obs.Status, obs.Granted, obs.Rand = status, g.at, 0.5
			if status == http.StatusTooManyRequests {
				obs.RetryAfter, obs.HasRetryAfter = 2*time.Second, true
			}
			if err := mem.Observe(ctx, key, now, obs, pol); err != nil {
				t.Fatal(err)
			}
			if err := stores[g.store].Observe(ctx, key, now, obs, pol); err != nil {
				t.Fatalf("step %d: observe: %v", i, err)
			}
			continue
		}
		s := rng.IntN(len(stores))
		wantWait, wantOK, _ := mem.Reserve(ctx, key, now, pol)
		wait, ok, err := stores[s].Reserve(ctx, key, now, pol)
		if err != nil {
			t.Fatalf("step %d: reserve: %v", i, err)
		}
		if wait != wantWait || ok != wantOK {
			t.Fatalf("step %d at %s: store %d reserved (%s, %v), MemoryStore (%s, %v)", i, now.Format(time.StampMilli), s, wait, ok, wantWait, wantOK)
		}
		if ok {
			open = append(open, grant{s, now})
		}
		memState, _ := mem.Snapshot(ctx, key, now, pol)
		for n, st := range stores {
			want := memState
			got, err := st.Snapshot(ctx, key, now, pol)
			if err != nil {
				t.Fatal(err)
			}
			if !got.Reset.Equal(want.Reset) || !got.PausedUntil.Equal(want.PausedUntil) {
				t.Fatalf("step %d: store %d sees reset %s paused until %s, MemoryStore %s, %s", i, n, got.Reset, got.PausedUntil, want.Reset, want.PausedUntil)
			}
			got.Reset, got.PausedUntil, want.Reset, want.PausedUntil = time.Time{}, time.Time{}, time.Time{}, time.Time{}
			if got != want {
				t.Fatalf("step %d: store %d sees %+v, MemoryStore %+v", i, n, got, want)
			}
		}
	}
	if len(srv.counts) < 5 {
		t.Errorf("the sequence spanned %d windows, want several", len(srv.counts))
	}
}

// A 429 observed by one process pauses the key for every other.
func TestRedisStore429PausesEveryProcess(t *testing.T) {
	_, rdb := newRedis(t)
	ctx := context.Background()
	a, b := NewRedisStore(rdb, RedisOptions{}), NewRedisStore(rdb, RedisOptions{})
	pol := Policy{Limit: 100, Window: time.Minute, MaxPause: time.Minute, ResetMargin: 100 * time.Millisecond}
	now := time.Unix(1_700_000_000, 0)
	if _, ok, err := a.Reserve(ctx, "k", now, pol); err != nil || !ok {
		t.Fatalf("first reserve: %v %v", ok, err)
	}
	obs := Observation{Status: http.StatusTooManyRequests, RetryAfter: 5 * time.Second, HasRetryAfter: true, Granted: now}
	if err := a.Observe(ctx, "k", now, obs, pol); err != nil {
		t.Fatal(err)
	}
	wait, ok, err := b.Reserve(ctx, "k", now.Add(time.Second), pol)
	if err != nil || ok || wait != 4*time.Second {
		t.Fatalf("other process: reserve = %s, %v, %v; want to wait the 4s left of the pause", wait, ok, err)
	}
}

// A process that dies with requests in flight holds them only until its
// holder entry expires.
func TestRedisStoreForgetsDeadProcess(t *testing.T) {
	_, rdb := newRedis(t)
	ctx := context.Background()
	ttl := 30 * time.Second
	dead, live := NewRedisStore(rdb, RedisOptions{HolderTTL: ttl}), NewRedisStore(rdb, RedisOptions{HolderTTL: ttl})
	pol := Policy{Limit: 100, Window: time.Minute, ResetMargin: 100 * time.Millisecond}
	now := time.Unix(1_700_000_000, 0)
	// Learn the window, so that requests may overlap.
	if _, ok, _ := live.Reserve(ctx, "k", now, pol); !ok {
		t.Fatal("first reserve refused")
	}
	obs := Observation{Status: 200, HasBudget: true, Limit: 100, Remaining: 99, Reset: now.Add(time.Minute), Granted: now}
	if err := live.Observe(ctx, "k", now, obs, pol); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, ok, err := dead.Reserve(ctx, "k", now.Add(time.Duration(i+1)*time.Second), pol); err != nil || !ok {
			t.Fatalf("reserve %d: %v %v", i, ok, err)
		}
	}
	if st, _ := live.Snapshot(ctx, "k", now.Add(10*time.Second), pol); st.InFlight != 3 {
		t.Fatalf("in flight = %d, want the dead process's 3", st.InFlight)
	}
	if st, err := live.Snapshot(ctx, "k", now.Add(3*time.Second+ttl), pol); err != nil {
		t.Fatal(err)
	} else if st.InFlight != 0 {
		t.Fatalf("in flight after the holder ttl = %d, want 0", st.InFlight)
	}
}

// Redis holds the key's id, never the API key.
func TestRedisStoreKeysNameNoAPIKey(t *testing.T) {
	_, rdb := newRedis(t)
	ctx := context.Background()
	const apiKey = "sk_live_do_not_store"
	g := New(apiKey, Options{Store: NewRedisStore(rdb, RedisOptions{})})
	tk, err := g.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tk.Done(200, nil)
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{DefaultRedisPrefix + KeyID(apiKey)}; !slices.Equal(keys, want) {
		t.Fatalf("redis keys = %q, want %q", keys, want)
	}
	val, err := rdb.HGet(ctx, keys[0], "s").Result()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(val, apiKey) || strings.Contains(keys[0], apiKey) {
		t.Fatal("the API key is stored in Redis")
	}
	if ttl, _ := rdb.PTTL(ctx, keys[0]).Result(); ttl <= 0 || ttl > DefaultKeyTTL {
		t.Errorf("key ttl = %s, want up to %s", ttl, DefaultKeyTTL)
	}
}

// TestConcurrentPacing's workload with every worker a process of its own
// (its own RedisStore): together they never see a 429 and use the windows.
func TestRedisStoreConcurrentProcesses(t *testing.T) {
	_, rdb := newRedis(t)
	const workers = 16
	start := time.Unix(1_700_000_000, 300_000_000)
	stop := time.Unix(1_700_000_008, 0)
	clock := newVirtualClock(start, workers)
	srv := &fixedWindow{limit: 100, window: time.Second, counts: map[int64]int{}}
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	var govs []*Governor
	for w := range workers {
		g := New("k", Options{Limit: 100, Window: time.Second, Reserve: 2, Clock: clock, Rand: func() float64 { return 0 },
			Store: NewRedisStore(rdb, RedisOptions{})})
		govs = append(govs, g)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer clock.leave()
			rng := rand.New(rand.NewPCG(uint64(w), 2))
			for clock.Now().Before(stop) {
				tk, err := g.Acquire(ctx)
				if err != nil {
					errs <- err
					return
				}
				_ = clock.Sleep(ctx, time.Duration(1+rng.IntN(30))*time.Millisecond)
				status, h := srv.hit(clock.Now())
				_ = clock.Sleep(ctx, time.Duration(1+rng.IntN(30))*time.Millisecond)
				tk.Done(status, h)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if srv.rejected != 0 {
		t.Errorf("platform answered 429 %d times, want 0", srv.rejected)
	}
	ends := slices.Sorted(maps.Keys(srv.counts))
	var perWindow []int
	for _, e := range ends {
		perWindow = append(perWindow, srv.counts[e])
	}
	t.Logf("requests per window: %v", perWindow)
	for _, e := range ends[1:] {
		if e > stop.Unix() {
			break
		}
		if n := srv.counts[e]; n < 90 {
			t.Errorf("window ending %d carried %d requests, want at least 90", e, n)
		}
	}
	if st, err := govs[0].State(ctx); err != nil || st.InFlight != 0 {
		t.Errorf("final state %+v (%v): want nothing in flight", st, err)
	}
}

// With Redis stopped, a FallbackStore over a RedisStore paces locally,
// counts the fallback, and returns to Redis once it answers again.
func TestFallbackStoreSurvivesRedisRestart(t *testing.T) {
	srv, rdb := newRedis(t)
	ctx := context.Background()
	f := NewFallbackStore(NewRedisStore(rdb, RedisOptions{}), FallbackOptions{Share: 0.25, Retry: 10 * time.Second})
	// The calls run on virtual time: the probe in the background is left
	// out (TestFallbackStoreProbesInTheBackground covers it).
	f.Close()
	pol := Policy{Limit: 100, Window: time.Minute, ResetMargin: 100 * time.Millisecond}
	now := time.Unix(1_700_000_000, 0)
	step := func(granted time.Time) {
		t.Helper()
		_, ok, err := f.Reserve(ctx, "k", granted, pol)
		if err != nil || !ok {
			t.Fatalf("reserve at %s: %v %v", granted, ok, err)
		}
		obs := Observation{Status: 200, HasBudget: true, Limit: 100, Remaining: 80, Reset: now.Add(time.Minute), Granted: granted}
		if err := f.Observe(ctx, "k", granted, obs, pol); err != nil {
			t.Fatal(err)
		}
	}
	step(now)
	if st := f.Stats(); st.Local || st.Fallbacks != 0 {
		t.Fatalf("stats with Redis up: %+v", st)
	}
	srv.Stop()
	step(now.Add(10 * time.Second))
	st := f.Stats()
	if !st.Local || st.Fallbacks != 1 || st.LocalGrants != 1 {
		t.Fatalf("stats with Redis down: %+v, want local, 1 fallback, 1 local grant", st)
	}
	if s, _ := f.Snapshot(ctx, "k", now.Add(10*time.Second), pol); s.Limit != 25 || s.Remaining != 20 {
		t.Errorf("local budget %+v: want a quarter of the platform's (limit 25, remaining 20)", s)
	}
	srv.Restart()
	// Within Retry the store stays local; after it, Redis is tried again.
	step(now.Add(15 * time.Second))
	if !f.Stats().Local {
		t.Fatal("switched back before the retry interval")
	}
	step(now.Add(25 * time.Second))
	if st := f.Stats(); st.Local || st.Fallbacks != 1 || st.LocalGrants != 2 {
		t.Fatalf("stats after Redis came back: %+v, want shared, 1 fallback, 2 local grants", st)
	}
}

// A reservation waiting for this process's call ahead of it on the key
// (stuck on a Redis that does not answer) gives up when its context ends.
func TestRedisStoreReserveGivesUpWaiting(t *testing.T) {
	_, rdb := newRedis(t)
	s := NewRedisStore(rdb, RedisOptions{})
	k := s.key("k")
	k.lock <- struct{}{} // the call ahead, still waiting for Redis
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := s.Reserve(ctx, "k", time.Unix(1_700_000_000, 0), Policy{Limit: 10, Window: time.Minute})
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("reserve: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a reservation waits for the call ahead whatever its context")
	}
	<-k.lock
}

// A key that expired, or a Redis that restarted empty, starts its versions
// at a random point: a process still holding a version from before cannot
// compare-and-set over a different state that reached the same number.
func TestRedisStoreVersionsDoNotRepeatAfterALostKey(t *testing.T) {
	_, rdb := newRedis(t)
	ctx := context.Background()
	s := NewRedisStore(rdb, RedisOptions{})
	pol := Policy{Limit: 100, Window: time.Minute, ResetMargin: 100 * time.Millisecond}
	now := time.Unix(1_700_000_000, 0)
	seen := map[int64]bool{}
	for round := range 5 {
		if _, ok, err := s.Reserve(ctx, "k", now, pol); err != nil || !ok {
			t.Fatalf("round %d: reserve: %v %v", round, ok, err)
		}
		v, raw, err := s.read(ctx, s.prefix+"k")
		if err != nil || raw == nil {
			t.Fatalf("round %d: read: %v (state %q)", round, err, raw)
		}
		if seen[v] {
			t.Fatalf("round %d: version %d again after the key was lost", round, v)
		}
		seen[v] = true
		obs := Observation{Status: 200, HasBudget: true, Limit: 100, Remaining: 99, Reset: now.Add(time.Minute), Granted: now}
		if err := s.Observe(ctx, "k", now, obs, pol); err != nil {
			t.Fatalf("round %d: observe: %v", round, err)
		}
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// probesEnded reports whether the store's background probes have all
// ended within d.
func probesEnded(f *FallbackStore, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		f.probes.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// probedStore is a RedisStore whose failed Snapshots (the background
// probe's calls, while Redis is down) are counted.
type probedStore struct {
	*RedisStore
	failed atomic.Int64
}

func (s *probedStore) Snapshot(ctx context.Context, key string, now time.Time, p Policy) (State, error) {
	st, err := s.RedisStore.Snapshot(ctx, key, now, p)
	if err != nil {
		s.failed.Add(1)
	}
	return st, err
}

// waitFailedProbes waits until s has failed n more Snapshots than it had
// when called, or fails the test after 10 s.
func waitFailedProbes(t *testing.T, s *probedStore, n int64) {
	t.Helper()
	want := s.failed.Load() + n
	deadline := time.Now().Add(10 * time.Second)
	for s.failed.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d failed probes of Redis in 10 s, want %d", s.failed.Load(), want)
		}
		time.Sleep(5 * time.Millisecond) // polling a counter, with a deadline
	}
}

// probeRunning tells whether f has a background probe running.
func probeRunning(f *FallbackStore) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stopProbe != nil
}

// fallBack makes f lose its shared store (srv stopped): a reservation on
// "k" fails there and f paces locally.
func fallBack(t *testing.T, f *FallbackStore, pol Policy) {
	t.Helper()
	if _, _, err := f.Reserve(context.Background(), "k", time.Now(), pol); err != nil {
		t.Fatalf("reserve with Redis down: %v, want local pacing's answer", err)
	}
	if st := f.Stats(); !st.Local || st.Fallbacks != 1 {
		t.Fatalf("stats with Redis down: %+v, want local after 1 fallback", st)
	}
}

// A process that makes no more calls once Redis is back (a serve process
// with nothing to fetch) still switches back to it: a probe in the
// background tries it every Retry, says so in the log, and ends. The
// budget it shows (the dashboard's quota page) is the shared one again.
func TestFallbackStoreProbesInTheBackground(t *testing.T) {
	srv, rdb := newRedis(t)
	ctx := context.Background()
	var logs syncbuf.Buffer
	const retry = 100 * time.Millisecond
	shared := &probedStore{RedisStore: NewRedisStore(rdb, RedisOptions{})}
	f := NewFallbackStore(shared, FallbackOptions{Share: 0.25, Retry: retry,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	t.Cleanup(func() { f.Close() })
	pol := Policy{Limit: 100, Window: time.Minute, ResetMargin: 100 * time.Millisecond}

	now := time.Now()
	if _, ok, err := f.Reserve(ctx, "k", now, pol); err != nil || !ok {
		t.Fatalf("reserve: %v %v", ok, err)
	}
	obs := Observation{Status: 200, HasBudget: true, Limit: 100, Remaining: 80, Reset: now.Add(time.Minute), Granted: now}
	if err := f.Observe(ctx, "k", now, obs, pol); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	fallBack(t, f, pol)
	if st, _ := f.Snapshot(ctx, "k", time.Now(), pol); st.Limit != 25 {
		t.Fatalf("budget shown with Redis down: %+v, want the local quarter (limit 25)", st)
	}
	// Redis still down: the probe keeps trying, and the store stays local.
	waitFailedProbes(t, shared, 3)
	if !f.Stats().Local {
		t.Fatal("switched back to Redis while it was down")
	}
	if !probeRunning(f) {
		t.Fatal("the background probe gave up while Redis was down")
	}

	srv.Restart()
	restarted := time.Now()
	deadline := restarted.Add(10 * time.Second)
	for f.Stats().Local {
		if time.Now().After(deadline) {
			t.Fatalf("still pacing locally 10 s after Redis came back, with no calls made; logs:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond) // polling the store's state, with a deadline
	}
	t.Logf("switched back %s after Redis restarted (retry every %s)", time.Since(restarted).Round(time.Millisecond), retry)
	if !strings.Contains(logs.String(), "reachable again") {
		t.Errorf("no \"reachable again\" in the logs:\n%s", logs.String())
	}
	if st := f.Stats(); st.Fallbacks != 1 {
		t.Errorf("stats after the switch back: %+v, want 1 fallback", st)
	}
	// The restarted Redis is empty: the shared budget is the seed.
	if st, err := f.Snapshot(ctx, "k", time.Now(), pol); err != nil || st.Limit != 100 {
		t.Errorf("budget shown once Redis is back: %+v (%v), want the shared one (limit 100)", st, err)
	}
	if !probesEnded(f, 5*time.Second) {
		t.Error("the background probe still runs after the switch back")
	}
}

// Close ends the background probe at once, Redis down or not, and none
// runs after it: the store no longer changes by itself.
func TestFallbackStoreCloseEndsTheProbe(t *testing.T) {
	srv, rdb := newRedis(t)
	const retry = 50 * time.Millisecond
	shared := &probedStore{RedisStore: NewRedisStore(rdb, RedisOptions{})}
	f := NewFallbackStore(shared, FallbackOptions{Retry: retry})
	pol := Policy{Limit: 100, Window: time.Minute, ResetMargin: 100 * time.Millisecond}
	srv.Stop()
	fallBack(t, f, pol)
	waitFailedProbes(t, shared, 3)
	closed := make(chan struct{})
	go func() {
		f.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close still waits for the background probe after 10 s")
	}
	if !probesEnded(f, time.Second) {
		t.Fatal("a probe still runs after Close")
	}
	srv.Restart()
	time.Sleep(10 * retry) // ten probe intervals in which a probe left running would have switched back
	if !f.Stats().Local {
		t.Error("switched back to Redis after Close with no call made: a probe ran after Close")
	}
	f.Close() // again: nothing happens
}

// A probe ends by itself once the Redis client it would use is closed (the
// process closing it on its way out without closing the store): it would
// never answer again.
func TestFallbackStoreProbeEndsWithItsClient(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: 1, DialTimeout: time.Second, DialerRetries: 1})
	const retry = 50 * time.Millisecond
	f := NewFallbackStore(NewRedisStore(rdb, RedisOptions{}), FallbackOptions{Retry: retry})
	t.Cleanup(func() { f.Close() })
	rdb.Close()
	fallBack(t, f, Policy{Limit: 100, Window: time.Minute, ResetMargin: 100 * time.Millisecond})
	if !probesEnded(f, 10*time.Second) {
		t.Fatal("the background probe still runs 10 s after its Redis client was closed")
	}
}

// skewedClock is a process's clock off by skew.
func skewedClock(skew time.Duration) func() time.Time {
	return func() time.Time { return time.Now().Add(skew) }
}

// Processes whose clocks differ by minutes share one budget all the same:
// a 429 pause seen by one holds the process whose clock is ahead (it used
// to find the pause long over and send at once, into more 429s), that
// process reports the pause in its own time, and the requests in flight
// in a process whose clock is behind count for the others (they used to
// be dropped at once as expired).
func TestRedisStoreProcessesWithSkewedClocks(t *testing.T) {
	_, rdb := newRedis(t)
	ctx := context.Background()
	const skew = 3 * time.Minute
	a := NewRedisStore(rdb, RedisOptions{})
	ahead, behind := NewRedisStore(rdb, RedisOptions{}), NewRedisStore(rdb, RedisOptions{})
	ahead.clock, behind.clock = skewedClock(skew), skewedClock(-skew)
	pol := Policy{Limit: 100, Window: time.Minute, MaxPause: time.Minute, ResetMargin: 100 * time.Millisecond}

	now := time.Now()
	if _, ok, err := a.Reserve(ctx, "paused", now, pol); err != nil || !ok {
		t.Fatalf("first reserve: %v %v", ok, err)
	}
	obs := Observation{Status: http.StatusTooManyRequests, RetryAfter: 30 * time.Second, HasRetryAfter: true, Granted: now}
	if err := a.Observe(ctx, "paused", now, obs, pol); err != nil {
		t.Fatal(err)
	}
	at := ahead.clock()
	wait, ok, err := ahead.Reserve(ctx, "paused", at, pol)
	if err != nil || ok || wait < 20*time.Second || wait > 30*time.Second {
		t.Errorf("process %s ahead: reserve = %s, %v, %v; want to wait out the rest of the 30s pause", skew, wait, ok, err)
	}
	st, err := ahead.Snapshot(ctx, "paused", ahead.clock(), pol)
	if left := st.PausedUntil.Sub(ahead.clock()); err != nil || left < 20*time.Second || left > 30*time.Second {
		t.Errorf("process %s ahead: snapshot says paused for %s more (%v), want the rest of 30s", skew, left, err)
	}

	// Requests in flight in the process behind count for the others.
	now = time.Now()
	if _, ok, err := a.Reserve(ctx, "busy", now, pol); err != nil || !ok {
		t.Fatalf("first reserve: %v %v", ok, err)
	}
	hdr := Observation{Status: 200, HasBudget: true, Limit: 100, Remaining: 99, Reset: now.Add(time.Minute), Granted: now}
	if err := a.Observe(ctx, "busy", now, hdr, pol); err != nil {
		t.Fatal(err)
	}
	// Paced: each grant comes after the wait the one before asked for,
	// which the process behind is taken to have slept.
	at = behind.clock()
	for granted := 0; granted < 3; {
		wait, ok, err := behind.Reserve(ctx, "busy", at, pol)
		switch {
		case err != nil:
			t.Fatal(err)
		case ok:
			granted++
		case wait <= 0 || wait > 10*time.Second:
			t.Fatalf("process %s behind: asked to wait %s", skew, wait)
		}
		at = at.Add(wait)
	}
	if st, err := a.Snapshot(ctx, "busy", time.Now(), pol); err != nil || st.InFlight != 3 {
		t.Errorf("in flight = %d (%v), want the 3 of the process %s behind", st.InFlight, err, skew)
	}
}

// A live process's request keeps counting however long it takes: its
// holder entry is renewed while it is in flight. Here it is the probe of a
// new key, which holds the key for every process until it is answered. A
// process that dies (Close: its renewals end, nothing observed) holds it
// only until its entry expires, HolderTTL after its last write: a new
// leader's first request waited the 2 minutes of the old default when the
// entry was not renewed and had to outlast any request.
func TestRedisStoreRenewsInFlightAndForgetsDeadProbe(t *testing.T) {
	_, rdb := newRedis(t)
	ctx := context.Background()
	// Renewed every third of it: a renewal would have to run 650 ms late
	// for the other process to see the entry expire while it lives.
	const ttl = time.Second
	holder, other := NewRedisStore(rdb, RedisOptions{HolderTTL: ttl}), NewRedisStore(rdb, RedisOptions{HolderTTL: ttl})
	t.Cleanup(func() { holder.Close(); other.Close() })
	pol := Policy{Limit: 100, Window: time.Minute, ResetMargin: 100 * time.Millisecond}
	if _, ok, err := holder.Reserve(ctx, "k", time.Now(), pol); err != nil || !ok {
		t.Fatalf("the probe of a new key: %v %v", ok, err)
	}
	// For four times the ttl, the probe still holds the key.
	for end := time.Now().Add(4 * ttl); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		wait, ok, err := other.Reserve(ctx, "k", time.Now(), pol)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			t.Fatalf("granted while the first process's probe is in flight (wait %s): its entry was not renewed", wait)
		}
		if st, err := other.Snapshot(ctx, "k", time.Now(), pol); err != nil || st.InFlight != 1 {
			t.Fatalf("in flight = %d (%v), want the probe's 1", st.InFlight, err)
		}
	}
	// The holder dies with its probe in flight.
	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	waitGrantedAfterDeath(t, other, pol, ttl)
}

// waitGrantedAfterDeath waits until s is granted a request on "k", which
// the probe of a process that has just died held, and fails t if that
// takes longer than the holder ttl allows.
func waitGrantedAfterDeath(t *testing.T, s *RedisStore, pol Policy, ttl time.Duration) {
	t.Helper()
	died := time.Now()
	for {
		_, ok, err := s.Reserve(context.Background(), "k", time.Now(), pol)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		if time.Since(died) > 2*ttl+time.Second {
			t.Fatalf("still refused %s after the holder died: its probe should stop counting within the ttl (%s)", time.Since(died), ttl)
		}
		time.Sleep(20 * time.Millisecond) // polling Redis, with a deadline
	}
	t.Logf("granted %s after the holder died (ttl %s)", time.Since(died).Round(time.Millisecond), ttl)
}

// A request a process lost track of (a Ticket never ended: no Observe) is
// renewed only until the process has made no call on its key for a while
// (maxRenewIdle): then it stops counting for the others one HolderTTL
// later, instead of holding the key, a probe here, for as long as the
// process runs.
func TestRedisStoreStopsRenewingALostRequest(t *testing.T) {
	_, rdb := newRedis(t)
	ctx := context.Background()
	const ttl, idle = 300 * time.Millisecond, 1200 * time.Millisecond
	holder, other := NewRedisStore(rdb, RedisOptions{HolderTTL: ttl}), NewRedisStore(rdb, RedisOptions{HolderTTL: ttl})
	holder.renewIdle = idle
	t.Cleanup(func() { holder.Close(); other.Close() })
	pol := Policy{Limit: 100, Window: time.Minute, ResetMargin: 100 * time.Millisecond}
	reserved := time.Now()
	if _, ok, err := holder.Reserve(ctx, "k", reserved, pol); err != nil || !ok {
		t.Fatalf("the probe of a new key: %v %v", ok, err)
	}
	for {
		_, ok, err := other.Reserve(ctx, "k", time.Now(), pol)
		if err != nil {
			t.Fatal(err)
		}
		since := time.Since(reserved)
		if ok {
			if since < idle {
				t.Fatalf("granted %s after the probe, before the holder's renewals were due to end (%s): it was not renewed", since, idle)
			}
			break
		}
		if since > idle+2*ttl+time.Second {
			t.Fatalf("still refused %s after the probe: a request lost %s ago should have stopped being renewed", since, idle)
		}
		time.Sleep(20 * time.Millisecond) // polling, with a deadline
	}
}

// A process alone on a key through Redis whose clock is minutes off
// Redis's (and the platform's) paces as one whose clock is right: no 429,
// and each of the platform's minutes carries most of its 30 requests. The
// window's reset, read from the platform's headers in the process's time,
// is stored in Redis's, as the other times are: stored as it came, it was
// minutes off, and a process behind took every window for over (a 429 in
// each) while one ahead waited for a reset minutes away (7 a minute).
func TestRedisStorePacesWithAClockMinutesOff(t *testing.T) {
	for _, skew := range []time.Duration{0, -3 * time.Minute, 3 * time.Minute} {
		t.Run(skew.String(), func(t *testing.T) {
			_, rdb := newRedis(t)
			s := NewRedisStore(rdb, RedisOptions{})
			t.Cleanup(func() { s.Close() })
			s.clock = skewedClock(skew)
			// Redis's clock is the platform's: real time, about (it moves
			// on by the test's second or so while the virtual time runs).
			start := time.Now().Truncate(time.Minute).Add(time.Minute)
			per, rejected, _ := paceFixedWindows(t, s, start, skew, 50*time.Millisecond, 5)
			checkPaced(t, per, rejected)
		})
	}
}

// A process whose clock is minutes ahead, the first on a key, writes the
// key in Redis's time all the same: it reads before its first write. Its
// probe, when it dies with it, stops holding the key for the others
// within the holder ttl (written in its own time, it held it 3 minutes).
func TestRedisStoreFirstWriterWithAClockAhead(t *testing.T) {
	_, rdb := newRedis(t)
	ctx := context.Background()
	const ttl = time.Second
	ahead, other := NewRedisStore(rdb, RedisOptions{HolderTTL: ttl}), NewRedisStore(rdb, RedisOptions{HolderTTL: ttl})
	t.Cleanup(func() { ahead.Close(); other.Close() })
	ahead.clock = skewedClock(3 * time.Minute)
	pol := Policy{Limit: 100, Window: time.Minute, ResetMargin: 100 * time.Millisecond}
	if _, ok, err := ahead.Reserve(ctx, "k", ahead.clock(), pol); err != nil || !ok {
		t.Fatalf("the probe of a new key: %v %v", ok, err)
	}
	if err := ahead.Close(); err != nil { // dies with its probe in flight
		t.Fatal(err)
	}
	waitGrantedAfterDeath(t, other, pol, ttl)
}
