package governor

import (
	"bytes"
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
	"testing"
	"time"
)

// virtualClock is a fake clock for a fixed set of goroutines (participants).
// Time stands still while any participant runs; when every participant is
// asleep, it jumps to the earliest wake-up. Tests are thus fast and never
// depend on the real scheduler's timing.
type virtualClock struct {
	mu     sync.Mutex
	now    time.Time
	active int
	timers []*vtimer
}

type vtimer struct {
	at time.Time
	ch chan struct{}
}

func newVirtualClock(now time.Time, participants int) *virtualClock {
	return &virtualClock{now: now, active: participants}
}

func (c *virtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *virtualClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	c.mu.Lock()
	t := &vtimer{at: c.now.Add(d), ch: make(chan struct{})}
	c.timers = append(c.timers, t)
	c.active--
	c.advanceLocked()
	c.mu.Unlock()
	select {
	case <-t.ch:
		return nil
	case <-ctx.Done():
		c.mu.Lock()
		defer c.mu.Unlock()
		if i := slices.Index(c.timers, t); i >= 0 {
			c.timers = slices.Delete(c.timers, i, i+1)
			c.active++
		}
		return ctx.Err()
	}
}

// leave removes a participant that has finished.
func (c *virtualClock) leave() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.active--
	c.advanceLocked()
}

func (c *virtualClock) advanceLocked() {
	if c.active > 0 || len(c.timers) == 0 {
		return
	}
	next := c.timers[0].at
	for _, t := range c.timers {
		if t.at.Before(next) {
			next = t.at
		}
	}
	c.now = next
	c.timers = slices.DeleteFunc(c.timers, func(t *vtimer) bool {
		if t.at.After(next) {
			return false
		}
		close(t.ch)
		c.active++
		return true
	})
}

// fixedWindow models the platform's limiter: limit requests per window,
// windows aligned on whole multiples of the window, Reset in Unix seconds.
type fixedWindow struct {
	mu       sync.Mutex
	limit    int
	window   time.Duration
	counts   map[int64]int // requests counted per window end (Unix seconds)
	rejected int
}

func (s *fixedWindow) hit(now time.Time) (int, http.Header) {
	s.mu.Lock()
	defer s.mu.Unlock()
	end := now.Truncate(s.window).Add(s.window)
	s.counts[end.Unix()]++
	n := s.counts[end.Unix()]
	h := http.Header{}
	h.Set("X-RateLimit-Limit", strconv.Itoa(s.limit))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(end.Unix(), 10))
	if n > s.limit {
		s.rejected++
		h.Set("X-RateLimit-Remaining", "0")
		h.Set("Retry-After", strconv.Itoa(int(end.Sub(now).Seconds())+1))
		return http.StatusTooManyRequests, h
	}
	h.Set("X-RateLimit-Remaining", strconv.Itoa(s.limit-n))
	return http.StatusOK, h
}

// TestConcurrentPacing runs 16 goroutines on one key against a fixed window
// of 100 per second with random latencies, starting mid-window after another
// process already used 60 requests of it. The platform must never answer
// 429, and every full window must carry at least minPerWindow requests.
func TestConcurrentPacing(t *testing.T) {
	for _, tc := range []struct {
		name         string
		limit        int
		window       time.Duration
		reserve      int
		maxLatency   int // milliseconds, each way
		minPerWindow int
	}{
		{"seed matches the platform", 100, time.Second, 0, 30, 90},
		{"seed is the trial tariff", 30, time.Minute, 0, 30, 90},
		// No reserve to absorb mistakes and round trips of up to 16% of the
		// window: only counting requests in flight avoids a 429.
		{"no reserve, slow network", 100, time.Second, -1, 80, 85},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const workers = 16
			start := time.Unix(1_700_000_000, 300_000_000) // 0.3s into a window
			stop := time.Unix(1_700_000_010, 0)            // nine full windows later
			clock := newVirtualClock(start, workers)
			srv := &fixedWindow{limit: 100, window: time.Second, counts: map[int64]int{}}
			srv.counts[start.Truncate(time.Second).Add(time.Second).Unix()] = 60
			g := New("k", Options{Limit: tc.limit, Window: tc.window, Reserve: tc.reserve, Clock: clock, Rand: func() float64 { return 0 }})

			ctx := context.Background()
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer clock.leave()
					rng := rand.New(rand.NewPCG(uint64(w), 1))
					latency := func() time.Duration { return time.Duration(1+rng.IntN(tc.maxLatency)) * time.Millisecond }
					for clock.Now().Before(stop) {
						tk, err := g.Acquire(ctx)
						if err != nil {
							errs <- err
							return
						}
						_ = clock.Sleep(ctx, latency())
						status, h := srv.hit(clock.Now())
						_ = clock.Sleep(ctx, latency())
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
			// The first window was partly used by someone else; the workers
			// stop at a window's end; every window between is full.
			if len(ends) < 10 {
				t.Fatalf("only %d windows used", len(ends))
			}
			for _, e := range ends[1:] {
				if e > stop.Unix() {
					break
				}
				if n := srv.counts[e]; n < tc.minPerWindow || n > 100 {
					t.Errorf("window ending %d carried %d requests, want %d..100", e, n, tc.minPerWindow)
				}
			}
			if st, _ := g.State(ctx); st.InFlight != 0 || st.Window != time.Second || st.Limit != 100 {
				t.Errorf("final state %+v: want nothing in flight, window 1s learned, limit 100", st)
			}
		})
	}
}

// TestPacedWithoutHeaders runs 4 goroutines on one key seeded at 5 per
// second against a server that answers 200 without rate-limit headers (a
// delivery target with only its configured rate_limit). The seed is all
// there is to go by, so it must hold: at most 5 grants in each of the
// budget's one-second windows, however fast the server answers.
func TestPacedWithoutHeaders(t *testing.T) {
	const workers, limit, n = 4, 5, 40
	start := time.Unix(1_700_000_000, 250_000_000)
	clock := newVirtualClock(start, workers)
	g := New("target", Options{Limit: limit, Window: time.Second, Reserve: -1, Clock: clock})
	ctx := context.Background()
	var (
		mu     sync.Mutex
		grants []time.Time
		wg     sync.WaitGroup
	)
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer clock.leave()
			for {
				tk, err := g.Acquire(ctx)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if len(grants) == n {
					mu.Unlock()
					tk.Abort()
					return
				}
				grants = append(grants, clock.Now())
				mu.Unlock()
				_ = clock.Sleep(ctx, 5*time.Millisecond) // the server answers at once
				tk.Done(http.StatusOK, http.Header{})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// The budget's windows are [start+k s, start+(k+1) s), each closed
	// ResetMargin late (a grant in the margin belongs to the window before).
	perWindow := map[int]int{}
	for _, at := range grants {
		perWindow[int(at.Sub(start.Add(DefaultResetMargin))/time.Second)]++
	}
	t.Logf("grants per window: %v; last at +%v", perWindow, grants[n-1].Sub(start))
	for w, c := range perWindow {
		if c > limit {
			t.Errorf("window %d carried %d grants, want at most %d", w, c, limit)
		}
	}
	if took := grants[n-1].Sub(start); took < (n/limit-1)*time.Second {
		t.Errorf("%d grants at %d per second took %v, want at least %v", n, limit, took, (n/limit-1)*time.Second)
	}
}

// stepClock is a fake clock for one goroutine: Sleep moves time forward at once.
type stepClock struct {
	mu     sync.Mutex
	now    time.Time
	slept  []time.Duration
	sleepF func(ctx context.Context, d time.Duration) error
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) Sleep(ctx context.Context, d time.Duration) error {
	if c.sleepF != nil {
		if err := c.sleepF(ctx, d); err != nil {
			return err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.slept = append(c.slept, d)
	c.now = c.now.Add(d)
	return ctx.Err()
}

func budgetHeader(remaining int, reset time.Time) http.Header {
	h := http.Header{}
	h.Set("X-RateLimit-Limit", "100")
	h.Set("X-RateLimit-Remaining", strconv.Itoa(remaining))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(reset.Unix(), 10))
	return h
}

func TestAcquireWaitsOut429Pause(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	clock := &stepClock{now: start}
	var logs bytes.Buffer
	g := New("secret-key-123", Options{Limit: 100, Window: time.Second, Clock: clock,
		Rand: func() float64 { return 0.5 }, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := context.Background()

	tk, err := g.Acquire(ctx)
	if err != nil || tk.Waited() != 0 {
		t.Fatalf("first Acquire = %v, waited %v", err, tk.Waited())
	}
	h := budgetHeader(50, start.Add(time.Second))
	h.Set("Retry-After", "2")
	tk.Done(http.StatusTooManyRequests, h)
	tk.Done(http.StatusOK, h) // a second end is ignored
	tk.Abort()

	st, _ := g.State(ctx)
	if want := start.Add(2300 * time.Millisecond); !st.PausedUntil.Equal(want) || st.Consecutive429 != 1 || st.InFlight != 0 {
		t.Fatalf("state after 429 = %+v, want paused until %v (2s + 15%% jitter)", st, want)
	}
	tk, err = g.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if tk.Waited() != 2300*time.Millisecond {
		t.Errorf("Waited = %v, want 2.3s", tk.Waited())
	}
	tk.Done(http.StatusOK, budgetHeader(49, start.Add(3*time.Second)))
	if st, _ := g.State(ctx); st.Consecutive429 != 0 || st.Remaining != 49 {
		t.Errorf("state after success = %+v", st)
	}
	if !strings.Contains(logs.String(), "key paused") || strings.Contains(logs.String(), "secret-key-123") {
		t.Errorf("logs must report the pause without the key:\n%s", logs.String())
	}
}

func TestAcquireCancelled(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	ctx, cancel := context.WithCancel(context.Background())
	clock := &stepClock{now: start, sleepF: func(ctx context.Context, d time.Duration) error {
		cancel() // cancelled while waiting for the reset
		<-ctx.Done()
		return ctx.Err()
	}}
	g := New("k", Options{Clock: clock})
	tk, err := g.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tk.Done(http.StatusOK, budgetHeader(5, start.Add(time.Minute))) // at the reserve
	if _, err := g.Acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire = %v, want context.Canceled", err)
	}
	if _, err := g.Acquire(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire on a done context = %v, want context.Canceled", err)
	}
	if st, err := g.State(context.Background()); err != nil {
		t.Fatal(err)
	} else if st.InFlight != 0 {
		t.Errorf("in flight = %d after cancelled acquires", st.InFlight)
	}
}

func TestAbortReleases(t *testing.T) {
	clock := &stepClock{now: time.Unix(1_700_000_000, 0)}
	g := New("k", Options{Clock: clock})
	tk, _ := g.Acquire(context.Background())
	if st, _ := g.State(context.Background()); st.InFlight != 1 || st.Learned {
		t.Fatalf("state = %+v, want 1 in flight, not learned", st)
	}
	tk.Abort()
	tk.Done(http.StatusOK, nil)
	if st, err := g.State(context.Background()); err != nil {
		t.Fatal(err)
	} else if st.InFlight != 0 || st.Learned {
		t.Fatalf("state = %+v, want released, still not learned", st)
	}
}

func TestParseHeaders(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name string
		h    map[string]string
		want Observation
	}{
		{"all three", map[string]string{"X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "7", "X-RateLimit-Reset": "1700000001"},
			Observation{HasBudget: true, Limit: 100, Remaining: 7, Reset: now.Add(time.Second)}},
		{"fractional reset", map[string]string{"X-RateLimit-Remaining": "7", "X-RateLimit-Reset": "1700000001.5"},
			Observation{HasBudget: true, Remaining: 7, Reset: now.Add(1500 * time.Millisecond)}},
		{"reset as seconds from now", map[string]string{"X-RateLimit-Remaining": "7", "X-RateLimit-Reset": "30"},
			Observation{HasBudget: true, Remaining: 7, Reset: now.Add(30 * time.Second)}},
		{"missing reset", map[string]string{"X-RateLimit-Remaining": "7"}, Observation{}},
		{"garbage remaining", map[string]string{"X-RateLimit-Remaining": "x", "X-RateLimit-Reset": "1700000001"}, Observation{}},
		{"negative remaining", map[string]string{"X-RateLimit-Remaining": "-1", "X-RateLimit-Reset": "1700000001"}, Observation{}},
		{"none", nil, Observation{}},
		{"Discord reset-after wins over reset", map[string]string{"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "4",
			"X-RateLimit-Reset": "1700000009", "X-RateLimit-Reset-After": "1.25"},
			Observation{HasBudget: true, Limit: 5, Remaining: 4, Reset: now.Add(1250 * time.Millisecond)}},
		{"reset-after alone", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": "2"},
			Observation{HasBudget: true, Remaining: 0, Reset: now.Add(2 * time.Second)}},
		// The platform's clock is 5 minutes behind ours: its reset, a
		// second after its Date, is a second from now, not in the past.
		{"platform clock behind", map[string]string{"X-RateLimit-Remaining": "7", "X-RateLimit-Reset": "1699999701",
			"Date": "Tue, 14 Nov 2023 22:08:20 GMT"},
			Observation{HasBudget: true, Remaining: 7, Reset: now.Add(time.Second)}},
		{"platform clock ahead", map[string]string{"X-RateLimit-Remaining": "7", "X-RateLimit-Reset": "1700000301",
			"Date": "Tue, 14 Nov 2023 22:18:20 GMT"},
			Observation{HasBudget: true, Remaining: 7, Reset: now.Add(time.Second)}},
		{"Date agreeing within a second", map[string]string{"X-RateLimit-Remaining": "7", "X-RateLimit-Reset": "1700000001.5",
			"Date": "Tue, 14 Nov 2023 22:13:19 GMT"},
			Observation{HasBudget: true, Remaining: 7, Reset: now.Add(1500 * time.Millisecond)}},

		// Resets that cannot be the current window's are read as no
		// headers: taken at their word, Remaining: 0 would be followed by
		// a refilled budget at once (a 429 storm), or a wait of centuries.
		{"NaN reset", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "NaN"}, Observation{}},
		{"reset in the past", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1699999995"}, Observation{}},
		{"reset now", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "0"}, Observation{}},
		{"reset-after zero", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": "0"}, Observation{}},
		{"reset in 2286", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "9999999999"}, Observation{}},
		{"a monthly quota's reset", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1702500000"},
			Observation{HasBudget: true, Remaining: 0, Reset: time.Unix(1702500000, 0)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.h {
				h.Set(k, v)
			}
			got := parseHeaders(h, now)
			if got.HasBudget != tt.want.HasBudget || got.Limit != tt.want.Limit || got.Remaining != tt.want.Remaining || !got.Reset.Equal(tt.want.Reset) {
				t.Errorf("parseHeaders = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestRegistry(t *testing.T) {
	r := NewRegistry(Options{})
	a, b := r.Get("key-a"), r.Get("key-b")
	if r.Get("key-a") != a || a == b {
		t.Fatal("want one governor per key")
	}
	if a.KeyID() != KeyID("key-a") || len(a.KeyID()) != 16 || strings.Contains(a.KeyID(), "key-a") {
		t.Fatalf("KeyID = %q", a.KeyID())
	}
	if KeyID("key-a") == KeyID("key-b") {
		t.Fatal("distinct keys share an id")
	}
	// Governors of one registry share its store, keyed by KeyID.
	tk, _ := a.Acquire(context.Background())
	defer tk.Abort()
	if st, err := b.State(context.Background()); err != nil {
		t.Fatal(err)
	} else if st.InFlight != 0 {
		t.Fatal("key-b sees key-a's request")
	}
	if st, _ := r.Get("key-a").State(context.Background()); st.InFlight != 1 {
		t.Fatal("key-a's request is not counted")
	}
}

func TestOptionsDefaults(t *testing.T) {
	got := Options{}.withDefaults().policy()
	want := Policy{Limit: 30, Window: time.Minute, Reserve: 5, MaxPause: 60 * time.Second, Jitter: 0.3, ResetMargin: 100 * time.Millisecond}
	if got != want {
		t.Errorf("defaults = %+v, want %+v", got, want)
	}
	got = Options{Reserve: -1, Jitter: 2, ResetMargin: -1}.withDefaults().policy()
	if got.Reserve != 0 || got.Jitter != 0.3 || got.ResetMargin != 0 {
		t.Errorf("overrides = %+v", got)
	}
}
