package governor

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
)

var (
	t0 = time.Date(2025, time.March, 1, 12, 0, 0, 0, time.UTC)
	// p is a fixed-window tariff of 100 per second, as the simulator serves.
	p = Policy{Limit: 100, Window: time.Second, Reserve: 5, MaxPause: 60 * time.Second, Jitter: 0.3, ResetMargin: 100 * time.Millisecond}
)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// known is a budget that has seen a response for the window ending at t0+1s.
func known(remaining, inflight int, lastGrant time.Time) Budget {
	return Budget{Limit: 100, Remaining: remaining, Reset: at(1000), Observed: at(1000), InFlight: inflight, LastGrant: lastGrant}
}

func TestDecide(t *testing.T) {
	tests := []struct {
		name string
		b    Budget
		now  time.Time
		p    Policy
		want time.Duration
	}{
		{"first grant of a window", known(100, 0, time.Time{}), at(0), p, 0},
		// 50 available over 1s: one every 20ms.
		{"spread: just granted", known(55, 0, at(0)), at(0), p, 20 * time.Millisecond},
		{"spread: part of the interval passed", known(55, 0, at(-5)), at(0), p, 15 * time.Millisecond},
		{"spread: interval passed", known(55, 0, at(-20)), at(0), p, 0},
		{"spread shrinks as reset nears", known(55, 0, at(500)), at(500), p, 10 * time.Millisecond},
		// 25 available (55 − 25 in flight − 5): one every 40ms.
		{"in-flight requests count", known(55, 25, at(0)), at(0), p, 40 * time.Millisecond},
		{"at the reserve: until reset + margin", known(5, 0, at(0)), at(200), p, 900 * time.Millisecond},
		{"below the reserve", known(2, 0, time.Time{}), at(200), p, 900 * time.Millisecond},
		{"in flight eat the rest: until reset", known(10, 5, time.Time{}), at(0), p, 1100 * time.Millisecond},
		{"one above the reserve", known(6, 0, time.Time{}), at(0), p, 0},
		{"paused by 429 despite budget", func() Budget { b := known(90, 0, time.Time{}); b.PausedUntil = at(3000); return b }(), at(0), p, 3 * time.Second},
		{"pause over", func() Budget { b := known(90, 0, time.Time{}); b.PausedUntil = at(0); return b }(), at(0), p, 0},
		{"probe in flight before first response", Budget{Limit: 100, Remaining: 100, Reset: at(1000), InFlight: 1}, at(0), p, probeRecheck},
		// 94 available (100 − 1 in flight − 5) over 1s, one just granted:
		// spread, not one at a time.
		{"a server that answered without headers: its seed stands", Budget{Limit: 100, Remaining: 100, Reset: at(1000), InFlight: 1, LastGrant: at(0), Answered: at(0)}, at(0), p, time.Second / 94},
		{"probe in flight in an assumed window of unknown length", Budget{Limit: 100, Remaining: 100, Reset: at(61000), Observed: at(1000), InFlight: 1}, at(1100), p, probeRecheck},
		{"assumed window of learned length spreads", Budget{Limit: 100, Remaining: 96, Reset: at(2000), Observed: at(1000), Window: time.Second, InFlight: 1, LastGrant: at(1100)}, at(1100), p, 10 * time.Millisecond},
		{"reserve capped at half a small limit", Budget{Limit: 4, Remaining: 3, Reset: at(1000), Observed: at(1000)}, at(0), p, 0},
		{"no reserve", known(1, 0, time.Time{}), at(0), Policy{Limit: 100, Window: time.Second}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := decide(tt.b, tt.now, tt.p); got != tt.want {
				t.Errorf("decide = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestReserve(t *testing.T) {
	t.Run("fresh start is seeded from the tariff and granted", func(t *testing.T) {
		var b Budget
		wait, ok := b.Reserve(at(0), p)
		if !ok || wait != 0 {
			t.Fatalf("Reserve = %v, %v; want granted", wait, ok)
		}
		want := Budget{Limit: 100, Remaining: 100, Reset: at(1000), InFlight: 1, LastGrant: at(0)}
		if b != want {
			t.Fatalf("budget = %+v, want %+v", b, want)
		}
		// The probe is out: the next request waits for its answer.
		if wait, ok := b.Reserve(at(0), p); ok || wait != probeRecheck {
			t.Fatalf("second Reserve = %v, %v; want probe wait", wait, ok)
		}
	})
	t.Run("a headerless answer ends the probe; a 5xx or an abort does not", func(t *testing.T) {
		for _, tc := range []struct {
			obs     Observation
			granted bool
		}{
			{Observation{Status: 200}, true},
			{Observation{Status: 404}, true},
			{Observation{Status: 503}, false},
			{Observation{Aborted: true}, false},
		} {
			var b Budget
			b.Reserve(at(0), p)
			b.Reserve(at(0), p) // waits for the probe
			b.Observe(at(5), tc.obs, p)
			if _, ok := b.Reserve(at(50), p); !ok {
				t.Fatalf("after %+v: the next request was not granted", tc.obs)
			}
			_, ok := b.Reserve(at(100), p) // with that one still in flight
			if ok != tc.granted {
				t.Errorf("after %+v: a second request in flight granted = %v, want %v", tc.obs, ok, tc.granted)
			}
		}
	})
	t.Run("before reset + margin the exhausted window holds", func(t *testing.T) {
		b := known(5, 0, at(900))
		if wait, ok := b.Reserve(at(1050), p); ok || wait != 50*time.Millisecond {
			t.Fatalf("Reserve = %v, %v; want wait 50ms", wait, ok)
		}
	})
	t.Run("after reset + margin a new window is assumed", func(t *testing.T) {
		b := known(5, 0, at(900))
		if _, ok := b.Reserve(at(1100), p); !ok {
			t.Fatal("not granted after reset")
		}
		if b.Remaining != 100 || !b.Reset.Equal(at(2000)) || !b.Observed.Equal(at(1000)) {
			t.Fatalf("budget = %+v, want remaining 100, reset t0+2s, observed t0+1s", b)
		}
	})
	t.Run("idle windows are skipped by the learned window", func(t *testing.T) {
		b := known(0, 0, time.Time{})
		b.Window = 2 * time.Second
		b.Reserve(at(7500), p)
		if !b.Reset.Equal(at(9000)) || b.Remaining != 100 {
			t.Fatalf("budget = %+v, want reset t0+9s, remaining 100", b)
		}
	})
}

func TestObserve(t *testing.T) {
	hdr := func(status, remaining int, reset time.Time) Observation {
		return Observation{Status: status, HasBudget: true, Limit: 100, Remaining: remaining, Reset: reset}
	}
	tests := []struct {
		name string
		b    Budget
		now  time.Time
		obs  Observation
		want Budget
	}{
		{
			name: "first response replaces the seed",
			b:    Budget{Limit: 30, Remaining: 30, Reset: at(60000), InFlight: 1, LastGrant: at(0)},
			now:  at(10), obs: hdr(200, 40, at(1000)),
			want: Budget{Limit: 100, Remaining: 40, Reset: at(1000), Observed: at(1000), LastGrant: at(0)},
		},
		{
			name: "same reset keeps the lower remaining (out of order)",
			b:    known(40, 2, at(0)),
			now:  at(10), obs: hdr(200, 45, at(1000)),
			want: known(40, 1, at(0)),
		},
		{
			name: "same reset, lower remaining",
			b:    known(40, 2, at(0)),
			now:  at(10), obs: hdr(200, 38, at(1000)),
			want: known(38, 1, at(0)),
		},
		{
			name: "later reset starts a new window and learns its length",
			b:    known(3, 1, at(900)),
			now:  at(1010), obs: hdr(200, 98, at(2000)),
			want: Budget{Limit: 100, Remaining: 98, Reset: at(2000), Observed: at(2000), Window: time.Second},
		},
		{
			name: "confirms the assumed window",
			b:    Budget{Limit: 100, Remaining: 100, Reset: at(2000), Observed: at(1000), InFlight: 1, LastGrant: at(1100)},
			now:  at(1110), obs: hdr(200, 97, at(2000)),
			want: Budget{Limit: 100, Remaining: 97, Reset: at(2000), Observed: at(2000), Window: time.Second, LastGrant: at(1100)},
		},
		{
			name: "assumed window too long is corrected",
			b:    Budget{Limit: 100, Remaining: 100, Reset: at(61000), Observed: at(1000), InFlight: 1, LastGrant: at(1100)},
			now:  at(1110), obs: hdr(200, 97, at(2000)),
			want: Budget{Limit: 100, Remaining: 97, Reset: at(2000), Observed: at(2000), Window: time.Second, LastGrant: at(1100)},
		},
		{
			name: "older reset is ignored",
			b:    Budget{Limit: 100, Remaining: 90, Reset: at(2000), Observed: at(2000), InFlight: 1, Window: time.Second},
			now:  at(1200), obs: hdr(200, 2, at(1000)),
			want: Budget{Limit: 100, Remaining: 90, Reset: at(2000), Observed: at(2000), Window: time.Second},
		},
		{
			name: "late answer from a window assumed over is ignored",
			b:    Budget{Limit: 100, Remaining: 100, Reset: at(2000), Observed: at(1000), InFlight: 1},
			now:  at(1200), obs: hdr(200, 1, at(1000)),
			want: Budget{Limit: 100, Remaining: 100, Reset: at(2000), Observed: at(1000)},
		},
		{
			name: "no headers after headers: only releases (their count stands)",
			b:    known(40, 1, at(0)),
			now:  at(10), obs: Observation{Status: 200},
			want: known(40, 0, at(0)),
		},
		{
			name: "no headers from a server that never sent any: the answer is spent",
			b:    Budget{Limit: 5, Remaining: 5, Reset: at(1000), InFlight: 1, LastGrant: at(0)},
			now:  at(10), obs: Observation{Status: 200, Granted: at(0)},
			want: Budget{Limit: 5, Remaining: 4, Reset: at(1000), LastGrant: at(0), Answered: at(10)},
		},
		{
			name: "no headers, 5xx: spent, the probe goes on",
			b:    Budget{Limit: 5, Remaining: 5, Reset: at(1000), InFlight: 1, LastGrant: at(0)},
			now:  at(10), obs: Observation{Status: 503, Granted: at(0)},
			want: Budget{Limit: 5, Remaining: 4, Reset: at(1000), LastGrant: at(0)},
		},
		{
			name: "no headers, granted in a window already over: counted there, not again",
			b:    Budget{Limit: 5, Remaining: 5, Reset: at(2000), InFlight: 1, LastGrant: at(1100), Answered: at(0)},
			now:  at(1200), obs: Observation{Status: 200, Granted: at(900)},
			want: Budget{Limit: 5, Remaining: 5, Reset: at(2000), LastGrant: at(1100), Answered: at(0)},
		},
		{
			name: "no headers, nothing left: stays at zero",
			b:    Budget{Limit: 5, Remaining: 0, Reset: at(1000), InFlight: 1, LastGrant: at(800), Answered: at(0)},
			now:  at(900), obs: Observation{Status: 200},
			want: Budget{Limit: 5, Remaining: 0, Reset: at(1000), LastGrant: at(800), Answered: at(0)},
		},
		{
			name: "429 pauses for Retry-After",
			b:    known(0, 1, at(0)),
			now:  at(10), obs: func() Observation {
				o := hdr(429, 0, at(1000))
				o.RetryAfter, o.HasRetryAfter = 2*time.Second, true
				return o
			}(),
			want: func() Budget {
				b := known(0, 0, at(0))
				b.PausedUntil = at(2010)
				b.Consecutive429 = 1
				b.PauseStart = at(10)
				return b
			}(),
		},
		{
			name: "consecutive 429 doubles, without Retry-After from the 1s base",
			b:    func() Budget { b := known(0, 1, at(0)); b.Consecutive429 = 2; return b }(),
			now:  at(10), obs: Observation{Status: 429},
			want: func() Budget {
				b := known(0, 0, at(0))
				b.PausedUntil = at(4010)
				b.Consecutive429 = 3
				b.PauseStart = at(10)
				return b
			}(),
		},
		{
			name: "a shorter pause never cuts a longer one",
			b:    func() Budget { b := known(0, 1, at(0)); b.PausedUntil = at(9000); return b }(),
			now:  at(10), obs: Observation{Status: 429, HasRetryAfter: true},
			want: func() Budget {
				b := known(0, 0, at(0))
				b.PausedUntil = at(9000)
				b.Consecutive429 = 1
				b.PauseStart = at(10)
				return b
			}(),
		},
		{
			name: "a 429 to a request in flight when the burst began does not double the pause",
			b: func() Budget {
				b := known(0, 1, at(0))
				b.Consecutive429, b.PauseStart, b.PausedUntil = 1, at(5), at(1005)
				return b
			}(),
			now: at(10), obs: Observation{Status: 429, Granted: at(1)},
			want: func() Budget {
				b := known(0, 0, at(0))
				b.Consecutive429, b.PauseStart, b.PausedUntil = 1, at(5), at(1010)
				return b
			}(),
		},
		{
			name: "a 429 to a request granted after the pause began doubles it",
			b: func() Budget {
				b := known(0, 1, at(0))
				b.Consecutive429, b.PauseStart, b.PausedUntil = 1, at(5), at(50)
				return b
			}(),
			now: at(200), obs: Observation{Status: 429, Granted: at(100)},
			want: func() Budget {
				b := known(0, 0, at(0))
				b.Consecutive429, b.PauseStart, b.PausedUntil = 2, at(200), at(2200)
				return b
			}(),
		},
		{
			name: "an aborted request is taken as spent",
			b:    known(50, 1, at(0)),
			now:  at(10), obs: Observation{Aborted: true},
			want: known(49, 0, at(0)),
		},
		{
			name: "success resets consecutive 429s",
			b:    func() Budget { b := known(50, 1, at(0)); b.Consecutive429 = 3; return b }(),
			now:  at(10), obs: Observation{Status: 200},
			want: known(50, 0, at(0)),
		},
		{
			name: "5xx and network errors keep consecutive 429s",
			b:    func() Budget { b := known(50, 2, at(0)); b.Consecutive429 = 3; return b }(),
			now:  at(10), obs: Observation{Status: 503},
			want: func() Budget { b := known(50, 1, at(0)); b.Consecutive429 = 3; return b }(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.b
			b.Observe(tt.now, tt.obs, p)
			if b != tt.want {
				t.Errorf("budget\n got %+v\nwant %+v", b, tt.want)
			}
		})
	}
}

func TestPauseFor(t *testing.T) {
	tests := []struct {
		name        string
		retryAfter  time.Duration
		ok          bool
		consecutive int
		r           float64
		want        time.Duration
	}{
		{"Retry-After, no jitter", 2 * time.Second, true, 0, 0, 2 * time.Second},
		{"Retry-After zero, first 429: retry now", 0, true, 0, 1, 0},
		{"Retry-After zero again: base pause doubled", 0, true, 3, 0, 8 * time.Second},
		{"absent: 1s base", 0, false, 0, 0, time.Second},
		{"doubled once", 2 * time.Second, true, 1, 0, 4 * time.Second},
		{"doubled three times", time.Second, false, 3, 0, 8 * time.Second},
		{"largest jitter is 30%", 10 * time.Second, true, 0, 1, 13 * time.Second},
		{"half jitter", 10 * time.Second, true, 0, 0.5, 11500 * time.Millisecond},
		{"jitter sample clamped", 10 * time.Second, true, 0, 7, 13 * time.Second},
		{"jitter capped", 50 * time.Second, true, 0, 1, 60 * time.Second},
		{"doubling capped", 20 * time.Second, true, 2, 0, 60 * time.Second},
		{"many consecutive do not overflow", time.Second, true, 500, 0.2, 60 * time.Second},
		{"huge Retry-After capped", 1 << 62, true, 0, 0, 60 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := pauseFor(tt.retryAfter, tt.ok, tt.consecutive, p, tt.r); got != tt.want {
				t.Errorf("pauseFor = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPauseForJitterBounds(t *testing.T) {
	for i := 0; i <= 100; i++ {
		r := float64(i) / 100
		d := pauseFor(4*time.Second, true, 1, p, r) // 8s base
		if d < 8*time.Second || d > 8*time.Second*13/10 {
			t.Fatalf("r=%v: pause %v outside [8s, 10.4s]", r, d)
		}
	}
}

// Resets given relative to each answer (Discord's Reset-After) jitter by a
// few milliseconds; they must not be taken for new, tiny windows.
func TestRelativeResetJitterIsOneWindow(t *testing.T) {
	p := Policy{Limit: 10, Window: time.Minute, Reserve: 0, MaxPause: time.Minute, ResetMargin: 100 * time.Millisecond}
	base := time.Unix(1_700_000_000, 0)
	var b Budget
	b.Observe(base, Observation{Status: 200, HasBudget: true, Limit: 10, Remaining: 9, Reset: base.Add(500 * time.Millisecond)}, p)
	b.Observe(base.Add(20*time.Millisecond), Observation{Status: 200, HasBudget: true, Limit: 10, Remaining: 8,
		Reset: base.Add(503 * time.Millisecond)}, p)
	if b.Window != 0 && b.Window < 100*time.Millisecond {
		t.Fatalf("learned a %v window from reset jitter", b.Window)
	}
	if !b.Reset.Equal(base.Add(500*time.Millisecond)) || b.Remaining != 8 {
		t.Fatalf("budget after jittered resets: reset %v remaining %d, want the first window with 8 left", b.Reset.Sub(base), b.Remaining)
	}
}

// paceFixedWindows drives s on key "k" against a platform of fixed
// windows of 30 requests a minute, from start (the platform's time, a
// whole minute) for minutes, from a process whose clock is skew off the
// platform's, each request answered lat after its grant with the
// platform's Date. It returns the requests each whole minute after the
// first carried, the answers 429 and the key's state at the end.
func paceFixedWindows(t *testing.T, s Store, start time.Time, skew, lat time.Duration, minutes int) (per []int, rejected int, st State) {
	t.Helper()
	ctx := context.Background()
	pol := Options{Limit: 30, Window: time.Minute, Jitter: -1}.withDefaults().policy()
	plat := &fixedWindow{limit: 30, window: time.Minute, counts: map[int64]int{}}
	local := start.Add(skew)
	end := local.Add(time.Duration(minutes) * time.Minute)
	for local.Before(end) {
		wait, ok, err := s.Reserve(ctx, "k", local, pol)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			local = local.Add(wait)
			continue
		}
		granted := local
		platNow := local.Add(-skew).Add(lat / 2)
		status, h := plat.hit(platNow)
		h.Set("Date", platNow.UTC().Format(http.TimeFormat))
		local = local.Add(lat)
		obs := parseHeaders(h, local)
		obs.Status, obs.Granted = status, granted
		if status == http.StatusTooManyRequests {
			obs.RetryAfter, obs.HasRetryAfter = backstop.RetryAfterIn(h, local)
		}
		if err := s.Observe(ctx, "k", local, obs, pol); err != nil {
			t.Fatal(err)
		}
	}
	for w := start.Unix() + 120; w <= start.Unix()+int64(minutes)*60; w += 60 {
		per = append(per, plat.counts[w])
	}
	st, err := s.Snapshot(ctx, "k", local, pol)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("per platform minute after the first %v, 429s %d, learned window %v", per, plat.rejected, st.Window)
	return per, plat.rejected, st
}

// checkPaced fails t unless the platform answered no 429 and each minute
// carried at least 20 of its 30 requests.
func checkPaced(t *testing.T, per []int, rejected int) {
	t.Helper()
	if rejected > 0 {
		t.Errorf("%d answers 429", rejected)
	}
	for i, n := range per {
		if n < 20 {
			t.Errorf("minute %d carried %d requests, want at least 20 of 30", i+2, n)
		}
	}
}

// A platform whose clock is minutes apart from this process's names each
// minute's window by the same X-RateLimit-Reset in every answer, but read
// through the answers' Date headers (whole seconds, plus the way here)
// that reset wanders by up to a second. It is one window all the same:
// the budget counts it down with every answer (when the wandering
// resets were taken for older windows, Remaining stood still and 429s
// followed), learns a minute as the window's length (not the wander),
// and never provokes a 429, with 50 ms or 300 ms answers.
func TestBudgetPacesAPlatformClockApart(t *testing.T) {
	for _, skew := range []time.Duration{0, -3 * time.Minute, 3 * time.Minute} {
		for _, lat := range []time.Duration{50 * time.Millisecond, 300 * time.Millisecond} {
			t.Run(skew.String()+"/"+lat.String(), func(t *testing.T) {
				per, rejected, st := paceFixedWindows(t, NewMemoryStore(), time.Unix(1_700_000_040, 0), skew, lat, 10)
				checkPaced(t, per, rejected)
				if st.Window != time.Minute {
					t.Errorf("learned window %v, want the platform's minute", st.Window)
				}
			})
		}
	}
}
