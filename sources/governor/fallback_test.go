package governor

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// funcStore is a Store whose methods are its Func fields.
type funcStore struct {
	ReserveFunc  func(ctx context.Context, key string, now time.Time, p Policy) (time.Duration, bool, error)
	ObserveFunc  func(ctx context.Context, key string, now time.Time, obs Observation, p Policy) error
	SnapshotFunc func(ctx context.Context, key string, now time.Time, p Policy) (State, error)
}

func (f funcStore) Reserve(ctx context.Context, key string, now time.Time, p Policy) (time.Duration, bool, error) {
	return f.ReserveFunc(ctx, key, now, p)
}

func (f funcStore) Observe(ctx context.Context, key string, now time.Time, obs Observation, p Policy) error {
	return f.ObserveFunc(ctx, key, now, obs, p)
}

func (f funcStore) Snapshot(ctx context.Context, key string, now time.Time, p Policy) (State, error) {
	if f.SnapshotFunc == nil {
		return State{}, errors.New("funcStore: no Snapshot")
	}
	return f.SnapshotFunc(ctx, key, now, p)
}

// A request is observed by the store that granted it, whatever happened
// to the shared store since; what the shared store cannot take is still
// learned locally.
func TestFallbackStoreObservesWhereGranted(t *testing.T) {
	ctx := context.Background()
	down := errors.New("connection refused")
	var sharedErr error
	var sharedObserved []time.Time
	mem := NewMemoryStore()
	shared := funcStore{
		ReserveFunc: func(ctx context.Context, key string, now time.Time, p Policy) (time.Duration, bool, error) {
			if sharedErr != nil {
				return 0, false, sharedErr
			}
			return mem.Reserve(ctx, key, now, p)
		},
		ObserveFunc: func(ctx context.Context, key string, now time.Time, obs Observation, p Policy) error {
			// Like RedisStore, the slot is released even when the write
			// fails (its next write restates the process's count).
			sharedObserved = append(sharedObserved, obs.Granted)
			_ = mem.Observe(ctx, key, now, obs, p)
			return sharedErr
		},
		SnapshotFunc: mem.Snapshot,
	}
	f := NewFallbackStore(shared, FallbackOptions{Share: 0.5, Retry: time.Second})
	// The calls run on virtual time: no probe in the background, on real
	// time, switches back behind their backs.
	f.Close()
	pol := Policy{Limit: 100, Window: time.Minute, MaxPause: time.Minute, ResetMargin: 100 * time.Millisecond}
	t0 := time.Unix(1_700_000_000, 0)
	reserve := func(at time.Time) {
		t.Helper()
		if _, ok, err := f.Reserve(ctx, "k", at, pol); err != nil || !ok {
			t.Fatalf("reserve at +%s: %v %v", at.Sub(t0), ok, err)
		}
	}
	headers := func(granted time.Time, status int) Observation {
		return Observation{Status: status, HasBudget: true, Limit: 100, Remaining: 60, Reset: t0.Add(time.Minute),
			Granted: granted, RetryAfter: 10 * time.Second, HasRetryAfter: status == 429}
	}

	reserve(t0) // granted by the shared store, which then goes away
	sharedErr = down
	onShared := t0
	if err := f.Observe(ctx, "k", t0.Add(time.Second), headers(onShared, 429), pol); err != nil {
		t.Fatal(err)
	}
	if len(sharedObserved) != 1 || !f.Stats().Local {
		t.Fatalf("a shared grant's answer with the store down: observed by it %d times, local=%v; want 1 and local", len(sharedObserved), f.Stats().Local)
	}
	// The 429 it carried pauses local pacing too: 10 s from +1 s.
	if wait, ok, _ := f.Reserve(ctx, "k", t0.Add(2*time.Second), pol); ok || wait != 9*time.Second {
		t.Fatalf("local reserve during the 429 pause: %s, %v; want to wait 9s", wait, ok)
	}
	if st, _ := f.Snapshot(ctx, "k", t0.Add(2*time.Second), pol); st.Limit != 50 || st.Remaining != 30 {
		t.Errorf("local budget %+v: want half the platform's (limit 50, remaining 30)", st)
	}

	onLocal := t0.Add(12 * time.Second)
	reserve(onLocal) // granted locally; the shared store comes back
	sharedErr = nil
	reserve(t0.Add(20 * time.Second))
	if f.Stats().Local {
		t.Fatal("still local after the shared store answered")
	}
	before := len(sharedObserved)
	if err := f.Observe(ctx, "k", t0.Add(21*time.Second), headers(onLocal, 200), pol); err != nil {
		t.Fatal(err)
	}
	if len(sharedObserved) != before {
		t.Error("a local grant's answer went to the shared store")
	}
	if st, _ := f.Snapshot(ctx, "k", t0.Add(21*time.Second), pol); st.InFlight != 1 {
		t.Errorf("shared store has %d in flight, want the one request it granted at +20s", st.InFlight)
	}
	if st := f.Stats(); st.Fallbacks != 1 || st.LocalGrants != 1 {
		t.Errorf("stats %+v, want 1 fallback and 1 local grant", st)
	}
}

// When the shared store fails, the calls still waiting on it (behind the
// failing one, or on a Redis that does not answer) give up and pace
// locally at once, instead of each waiting out its own timeout.
func TestFallbackStoreReleasesWaitersWhenSharedFails(t *testing.T) {
	ctx := context.Background()
	down := errors.New("i/o timeout")
	entered := make(chan struct{}, 2)
	fail := make(chan struct{})
	var calls atomic.Int32
	shared := funcStore{
		ReserveFunc: func(ctx context.Context, key string, now time.Time, p Policy) (time.Duration, bool, error) {
			entered <- struct{}{}
			if calls.Add(1) == 1 {
				<-fail
				return 0, false, down
			}
			<-ctx.Done() // a Redis that does not answer
			return 0, false, ctx.Err()
		},
	}
	f := NewFallbackStore(shared, FallbackOptions{Share: 0.5})
	t.Cleanup(func() { f.Close() })
	pol := Policy{Limit: 100, Window: time.Minute, ResetMargin: 100 * time.Millisecond}
	t0 := time.Unix(1_700_000_000, 0)
	results := make(chan error, 2)
	reserve := func() {
		// Granted, or told how long to wait, by local pacing.
		_, _, err := f.Reserve(ctx, "k", t0, pol)
		results <- err
	}
	go reserve()
	<-entered
	go reserve()
	<-entered
	close(fail)
	for range 2 {
		select {
		case err := <-results:
			if err != nil {
				t.Errorf("reserve: %v, want local pacing's answer", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a reservation still waits on the shared store after it failed")
		}
	}
	if st := f.Stats(); !st.Local || st.Fallbacks != 1 || st.LocalGrants < 1 {
		t.Errorf("stats %+v, want local, 1 fallback, local grants", st)
	}
}

// While the background probe tries the shared store, the calls pace
// locally without trying it themselves: none waits on an unreachable
// Redis (a refused dial alone takes most of a second with go-redis's
// retries).
func TestFallbackStoreCallsLeaveRetriesToTheProbe(t *testing.T) {
	ctx := context.Background()
	var reserves, snapshots atomic.Int32
	down := errors.New("connection refused")
	shared := funcStore{
		ReserveFunc: func(context.Context, string, time.Time, Policy) (time.Duration, bool, error) {
			reserves.Add(1)
			return 0, false, down
		},
		SnapshotFunc: func(context.Context, string, time.Time, Policy) (State, error) {
			snapshots.Add(1)
			return State{}, down
		},
	}
	f := NewFallbackStore(shared, FallbackOptions{Retry: 20 * time.Millisecond})
	t.Cleanup(func() { f.Close() })
	pol := Policy{Limit: 1000, Window: time.Minute, ResetMargin: 100 * time.Millisecond}
	t0 := time.Now()
	for i := range 20 {
		// Well past Retry each time: without the probe, each would try.
		if _, _, err := f.Reserve(ctx, "k", t0.Add(time.Duration(i)*time.Second), pol); err != nil {
			t.Fatal(err)
		}
	}
	if n := reserves.Load(); n != 1 {
		t.Errorf("the shared store was asked %d times, want once (the call that found it down)", n)
	}
	waitUntil := time.Now().Add(10 * time.Second)
	for snapshots.Load() < 2 {
		if time.Now().After(waitUntil) {
			t.Fatal("the background probe did not try the shared store twice in 10 s")
		}
		time.Sleep(5 * time.Millisecond) // polling the probe's count, with a deadline
	}
	f.Close()
	// Closed, the probe is gone: a call tries the shared store again.
	if _, _, err := f.Reserve(ctx, "k", t0.Add(time.Minute), pol); err != nil {
		t.Fatal(err)
	}
	if n := reserves.Load(); n != 2 {
		t.Errorf("after Close the shared store was asked %d times, want twice", n)
	}
}
