package main

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sinks/delivery"
	"github.com/backstop-sync/backstop/sources"
	"github.com/backstop-sync/backstop/sources/governor"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
	bsync "github.com/backstop-sync/backstop/sync"
)

// What serve's jobs emit (a sync's new and changed objects, a reconcile's
// re-emitted events) goes through wakingStore, which wakes the targets it
// queued rows for: the rows are delivered at once, with the dispatcher
// polling only hourly here.
func TestJobEmitsAreDeliveredWithoutWaitingForThePoll(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, err := store.Open(ctx, filepath.Join(t.TempDir(), "j.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	dispatcher, got := hourlyDispatcher(t, db)

	platform := sim.New(sim.Options{Seed: 7, Objects: 30})
	api := httptest.NewServer(platform.Handler())
	defer api.Close()
	client, err := sources.New(sources.Options{BaseURL: api.URL, APIKey: platform.APIKey(), PageSize: 100,
		Governor: governor.New(platform.APIKey(), governor.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	engine := &bsync.Engine{Source: client, Mirror: wakingStore{DB: db, wake: dispatcher.Wake}, PageSize: 100}
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}

	// want waits for n deliveries whose event ids start with prefix.
	want := func(what string, n int, prefix string) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for seen := 0; seen < n; {
			select {
			case id := <-got:
				if !strings.HasPrefix(id, prefix) {
					t.Fatalf("%s: delivered %s, want an id starting %q", what, id, prefix)
				}
				seen++
			case <-deadline:
				t.Fatalf("%s: %d of %d events delivered after 30 s (the dispatcher polls hourly)", what, seen, n)
			}
		}
	}

	// A sync job's run emits every payment new to the mirror.
	_, em, err := engine.SyncEmit(ctx, backstop.Payments, routes)
	if err != nil {
		t.Fatal(err)
	}
	if em.Emitted == 0 {
		t.Fatal("the sync emitted nothing")
	}
	want("sync", em.Emitted, "evt_bs_")

	// Changes the mirror misses (no webhooks here) are found and
	// re-emitted by a reconcile.
	platform.Mutate(40)
	rep, err := engine.Reconcile(ctx, backstop.Payments, bsync.ReconcileOptions{Full: true, Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Reemitted == 0 {
		t.Fatalf("the reconcile re-emitted nothing: %+v", rep)
	}
	want("reconcile", rep.Reemitted, "evt_bs_")
}

// hourlyDispatcher starts a delivery dispatcher over db that polls only
// hourly, with one target, billing, a local server that passes on the
// X-Event-Id of every delivery it gets; both stop at the test's end. What
// reaches the target within a test's seconds was sent because something
// woke its worker.
func hourlyDispatcher(t *testing.T, db *store.DB) (*delivery.Dispatcher, <-chan string) {
	t.Helper()
	got := make(chan string, 1000)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("X-Event-Id")
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(target.Close)
	dispatcher, err := delivery.New(newDeliveryQueue(db), []delivery.Target{{
		Name: "billing", URL: target.URL, Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", AllowPrivate: true,
	}}, delivery.Options{Logger: slog.New(slog.DiscardHandler), Poll: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); dispatcher.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return dispatcher, got
}
