package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	stdsync "sync"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/cmd/backstop/config"
	"github.com/backstop-sync/backstop/sinks/delivery"
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
}

func (b *bucketTarget) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
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

// A target that answers with rate-limit headers is paced by the governor:
// every event delivered, no 429 provoked.
func TestTargetPacedFromItsHeaders(t *testing.T) {
	bucket := &bucketTarget{limit: 10, window: 500 * time.Millisecond, start: time.Now(), delivered: map[string]bool{}}
	srv := httptest.NewServer(bucket)
	defer srv.Close()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "p.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const n = 40
	for i := range n {
		if _, err := db.Enqueue(context.Background(), "discord", fmt.Sprintf("evt_%d", i), "alert", []byte(`{"content":"hi"}`), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	cfgTargets := []config.Target{{Name: "discord"}}
	d, err := delivery.New(deliveryQueue{db}, []delivery.Target{{Name: "discord", URL: srv.URL, AllowPrivate: true,
		RetrySchedule: []time.Duration{time.Second}}},
		delivery.Options{Poll: 20 * time.Millisecond, Pacers: targetPacers(cfgTargets, slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	waitFor(t, time.Minute, func() bool {
		bucket.mu.Lock()
		defer bucket.mu.Unlock()
		return len(bucket.delivered) == n
	})
	cancel()
	<-done
	bucket.mu.Lock()
	defer bucket.mu.Unlock()
	t.Logf("%d delivered, %d answered 429", bucket.ok, bucket.over)
	if bucket.over != 0 {
		t.Errorf("the target answered 429 %d times: pacing from its headers failed", bucket.over)
	}
}
