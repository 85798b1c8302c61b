package governor

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// A 429's pause lifted by LiftPause lets the requests waiting in Acquire
// go within pauseRecheck, in this process and in another one sharing the
// budget in Redis, instead of at the pause's end (60 s here); the lifted
// pause does not count as a consecutive 429 for the next one.
func TestLiftPauseLetsWaitingRequestsGo(t *testing.T) {
	_, rdb := newRedis(t)
	stores := map[string][2]Store{
		"memory": func() [2]Store { m := NewMemoryStore(); return [2]Store{m, m} }(),
		"redis":  {NewRedisStore(rdb, RedisOptions{}), NewRedisStore(rdb, RedisOptions{})},
		"redis behind a fallback": {NewFallbackStore(NewRedisStore(rdb, RedisOptions{Prefix: "fb:"}), FallbackOptions{}),
			NewFallbackStore(NewRedisStore(rdb, RedisOptions{Prefix: "fb:"}), FallbackOptions{})},
	}
	for name, st := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			opts := Options{Limit: 100, Window: time.Minute, MaxPause: time.Minute}
			held := &heldStore{Store: st[1], refused: make(chan struct{}, 1)}
			a, b := New("target-"+name, Options{Limit: opts.Limit, Window: opts.Window, MaxPause: opts.MaxPause, Store: st[0]}),
				New("target-"+name, Options{Limit: opts.Limit, Window: opts.Window, MaxPause: opts.MaxPause, Store: held})
			tk, err := a.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			tk.Done(http.StatusTooManyRequests, http.Header{"Retry-After": {"60"}})
			if s, err := b.State(ctx); err != nil || time.Until(s.PausedUntil) < 50*time.Second {
				t.Fatalf("after a 429 with Retry-After 60: %+v %v", s, err)
			}
			got := make(chan error, 1)
			waiting := time.Now()
			go func() {
				tk, err := b.Acquire(ctx)
				if err == nil {
					tk.Done(http.StatusOK, nil)
				}
				got <- err
			}()
			<-held.refused // b waits for the pause
			if err := a.LiftPause(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("a request waiting since %s is still held 10 s after the pause was lifted", waiting.Format(time.StampMilli))
			}
			if s, err := a.State(ctx); err != nil || !s.PausedUntil.IsZero() && s.PausedUntil.After(time.Now()) || s.Consecutive429 != 0 {
				t.Errorf("state after the lift: %+v %v; want no pause and no 429 counted", s, err)
			}
		})
	}
}

// heldStore is a Store that signals refused when a Reserve is refused.
type heldStore struct {
	Store
	refused chan struct{}
}

func (s *heldStore) Reserve(ctx context.Context, key string, now time.Time, p Policy) (time.Duration, bool, error) {
	wait, ok, err := s.Store.Reserve(ctx, key, now, p)
	if err == nil && !ok {
		select {
		case s.refused <- struct{}{}:
		default:
		}
	}
	return wait, ok, err
}
