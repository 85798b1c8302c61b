package governor_test

import (
	"context"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sources/governor"
	"github.com/backstop-sync/backstop/sources/sim"
)

// TestPacingAgainstPlatformClockApart runs four workers on one key for
// three seconds against the simulator (20 requests per one-second window)
// whose clock is minutes apart from this machine's, as it sends it in its
// Date header. Its X-RateLimit-Reset (Unix seconds) is in its own clock:
// read against ours, a platform 3 minutes behind would look reset already
// (429s), and one 3 minutes ahead would hold every worker for 3 minutes
// after the first window. Neither may happen: no 429, and the requests go
// on window after window.
func TestPacingAgainstPlatformClockApart(t *testing.T) {
	for _, tc := range []struct {
		name string
		skew time.Duration
	}{
		{"same clock", 0},
		{"platform 3 minutes behind", -3 * time.Minute},
		{"platform 3 minutes ahead", 3 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const (
				limit   = 20
				workers = 4
				run     = 3 * time.Second
			)
			s := sim.New(sim.Options{Seed: 1, Objects: 10, Limit: limit, Window: time.Second,
				Now: func() time.Time { return time.Now().Add(tc.skew) }})
			api := httptest.NewServer(s.Handler())
			defer api.Close()
			g := governor.New(s.APIKey(), governor.Options{Limit: limit, Window: time.Second, Reserve: 1})
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()

			stop := time.Now().Add(run)
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Now().Before(stop) {
						if err := governedGet(ctx, g, api.Client(), api.URL, s.APIKey()); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatalf("a worker stopped: %v (the governor waited for a reset that was not coming)", err)
			}
			st := s.Stats()
			var used []int
			for _, w := range st.Windows {
				used = append(used, w.Requests)
			}
			t.Logf("requests per platform window: %v", used)
			if st.RateLimited != 0 {
				t.Errorf("platform answered 429 %d times, want 0", st.RateLimited)
			}
			// Three seconds span at least three windows (the first and
			// last partly); each must have carried requests.
			if len(used) < 3 {
				t.Errorf("requests went to %d platform windows in %v, want 3 or more: the workers stalled", len(used), run)
			}
		})
	}
}
