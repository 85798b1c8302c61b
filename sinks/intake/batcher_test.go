package intake_test

import (
	"context"
	"path/filepath"
	"slices"
	stdsync "sync"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/store"
)

// OnQueued names, after its commit and before the webhook is answered,
// each target an accepted event was queued for, and no target for a
// duplicate or an event no target subscribes to.
func TestBatcherWakesTheTargetsItQueuedFor(t *testing.T) {
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "intake.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var mu stdsync.Mutex
	var woken []string
	routes := []backstop.Route{
		{Target: "billing", Events: []string{"payment.*"}},
		{Target: "crm", Events: []string{"contact.*"}},
		{Target: "audit", Events: []string{"payment.succeeded"}},
	}
	w := intake.NewBatcher(db, intake.BatcherOptions{Routes: routes, OnQueued: func(target string) {
		mu.Lock()
		woken = append(woken, target)
		mu.Unlock()
	}})
	done := make(chan struct{})
	go func() { defer close(done); w.Run(context.Background()) }()
	defer func() { w.Close(context.Background()); <-done }()

	at := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	payment := backstop.Event{
		ID: "evt_1", Type: "payment.succeeded", Resource: backstop.Payments, ObjectID: "pay_1",
		UpdatedAt: at, CreatedAt: at, Origin: backstop.OriginWebhook,
		Data: []byte(`{"id":"pay_1","updated_at":"2026-03-01T10:00:00Z"}`),
	}
	unrouted := backstop.Event{ID: "evt_2", Type: "chat.closed.weird", Origin: backstop.OriginWebhook}
	for _, tc := range []struct {
		ev   backstop.Event
		want []string
	}{
		{payment, []string{"audit", "billing"}},
		{payment, nil}, // a duplicate queues nothing
		{unrouted, nil},
	} {
		mu.Lock()
		woken = nil
		mu.Unlock()
		if _, err := w.Submit(context.Background(), tc.ev); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		got := slices.Sorted(slices.Values(woken))
		mu.Unlock()
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: woke %v, want %v", tc.ev.ID, got, tc.want)
		}
	}
}
