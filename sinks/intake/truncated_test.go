package intake_test

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/sources"
	"github.com/backstop-sync/backstop/sources/governor"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// A truncated event is stored and acknowledged at once; the fetcher gets the
// object through the governed client and completes it. A failed fetch is
// retried, logged and counted.
func TestTruncatedEventIsCompletedFromTheAPI(t *testing.T) {
	s, client, db := truncatedSetup(t, sim.Options{Seed: 3, Objects: 200, BigObjects: 2})

	// The biggest message: over 64 KiB, so the platform truncates it.
	var big backstop.Object
	for _, o := range s.Objects(backstop.Messages) {
		if len(o.Data) > len(big.Data) {
			big = o
		}
	}
	if len(big.Data) <= intake.MaxBody {
		t.Fatalf("largest sim message is %d bytes; want one over 64 KiB", len(big.Data))
	}
	body := []byte(`{"event_id":"evt_trunc","event":"message.created","created_at":"2026-03-01T10:00:00Z","truncated":true,"data":{"id":"` + big.ID + `"}}`)
	ev, err := intake.ParseEnvelope(body)
	if err != nil {
		t.Fatal(err)
	}
	routes := []backstop.Route{{Target: "crm", Events: []string{"message.*"}}}
	if res, err := db.Emit(context.Background(), []backstop.Event{ev}, routes); err != nil || res[0].Status != backstop.EmitAccepted {
		t.Fatalf("emit truncated: %v %v", res, err)
	}

	metrics := intake.NewMetrics(prometheus.NewRegistry())
	now := time.Now()
	clock := func() time.Time { return now }
	f := intake.NewFetcher(db, client, intake.FetcherOptions{Routes: routes, Metrics: metrics, Now: clock, Interval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// First the API fails: the fetch is retried later, and the failure shows.
	s.SetErrorRate(1)
	f.Wake()
	waitFor(t, func() bool {
		pe, _, _ := db.ProcessedEvent(context.Background(), "evt_trunc")
		return pe.FetchAttempts >= 1
	})
	pe, _, _ := db.ProcessedEvent(context.Background(), "evt_trunc")
	if !pe.Truncated || pe.LastFetchError == "" || !pe.NextFetchAt.After(now) {
		t.Fatalf("after a failed fetch: %+v", pe)
	}
	if got := testutil.ToFloat64(metrics.TruncatedFetches.WithLabelValues("error")); got < 1 {
		t.Errorf("failed fetches metric = %v", got)
	}

	// The API recovers and the retry comes due: the event is completed.
	s.SetErrorRate(0)
	now = pe.NextFetchAt.Add(time.Millisecond)
	f.Wake()
	waitFor(t, func() bool {
		pe, _, _ := db.ProcessedEvent(context.Background(), "evt_trunc")
		return !pe.Truncated
	})
	got, ok, err := db.Get(context.Background(), backstop.Messages, big.ID)
	if err != nil || !ok || string(got.Data) != string(big.Data) {
		t.Fatalf("mirror after completion: ok=%v err=%v, %d bytes, want %d", ok, err, len(got.Data), len(big.Data))
	}
	rows, err := db.OutboxRows(context.Background(), "crm")
	if err != nil || len(rows) != 1 || !strings.Contains(string(rows[0].Payload), big.ID) {
		t.Fatalf("outbox after completion: %v %+v", err, rows)
	}
	if got := testutil.ToFloat64(metrics.TruncatedFetches.WithLabelValues("ok")); got != 1 {
		t.Errorf("completed fetches metric = %v, want 1", got)
	}
}

// A truncated event whose object the platform says does not exist is
// retried while the object may still be on its way (NotFoundGrace after the
// event's created_at), then given up: logged, counted, no longer pending
// and never fetched again, neither mirrored nor queued, and still a
// duplicate when the platform sends it again.
func TestTruncatedEventWithoutObjectIsGivenUp(t *testing.T) {
	_, client, db := truncatedSetup(t, sim.Options{Seed: 3, Objects: 20})
	created := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	body := []byte(`{"event_id":"evt_gone","event":"payment.succeeded","created_at":"2026-03-01T10:00:00Z","truncated":true,"data":{"id":"pay_doesnotexist"}}`)
	ev, err := intake.ParseEnvelope(body)
	if err != nil {
		t.Fatal(err)
	}
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	if res, err := db.Emit(context.Background(), []backstop.Event{ev}, routes); err != nil || res[0].Status != backstop.EmitAccepted {
		t.Fatalf("emit truncated: %v %v", res, err)
	}

	metrics := intake.NewMetrics(prometheus.NewRegistry())
	var mu sync.Mutex
	now := created.Add(time.Minute) // the object may still be on its way
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	f := intake.NewFetcher(db, client, intake.FetcherOptions{Routes: routes, Metrics: metrics, Now: clock, Interval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// Within the grace a 404 is retried like any failure.
	waitFor(t, func() bool {
		pe, _, _ := db.ProcessedEvent(context.Background(), "evt_gone")
		return pe.FetchAttempts >= 1
	})
	pe, _, _ := db.ProcessedEvent(context.Background(), "evt_gone")
	if !pe.Truncated || !pe.NextFetchAt.After(created) {
		t.Fatalf("after a 404 within the grace: %+v, want it retried", pe)
	}
	if got := testutil.ToFloat64(metrics.TruncatedFetches.WithLabelValues("gave_up")); got != 0 {
		t.Fatalf("given up within the grace: %v", got)
	}

	// Past the grace, the next 404 gives it up.
	mu.Lock()
	now = created.Add(intake.DefaultNotFoundGrace + time.Minute)
	mu.Unlock()
	f.Wake()
	waitFor(t, func() bool {
		pe, _, _ := db.ProcessedEvent(context.Background(), "evt_gone")
		return !pe.Truncated
	})
	pe, _, _ = db.ProcessedEvent(context.Background(), "evt_gone")
	if !strings.HasPrefix(pe.LastFetchError, "given up") || pe.FetchAttempts < 2 {
		t.Fatalf("given-up event: %+v", pe)
	}
	if got := testutil.ToFloat64(metrics.TruncatedFetches.WithLabelValues("gave_up")); got != 1 {
		t.Errorf("gave_up fetches metric = %v, want 1", got)
	}
	if n, err := db.CountTruncatedPending(context.Background()); err != nil || n != 0 {
		t.Errorf("truncated pending = %d (%v), want 0", n, err)
	}
	if rows, err := db.OutboxRows(context.Background(), "billing"); err != nil || len(rows) != 0 {
		t.Errorf("outbox of a given-up event: %v %+v, want none", err, rows)
	}
	if _, ok, err := db.Get(context.Background(), backstop.Payments, "pay_doesnotexist"); err != nil || ok {
		t.Errorf("mirror has the missing object: ok=%v err=%v", ok, err)
	}
	if res, err := db.Emit(context.Background(), []backstop.Event{ev}, routes); err != nil || res[0].Status != backstop.EmitDuplicate {
		t.Errorf("the platform's retry of a given-up event: %v %v, want a duplicate", res, err)
	}
}

// waitFor polls cond with a deadline (background work, no fixed sleeps).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 20s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The truncated-fetch results are exported from the start, at zero, so a
// fresh serve's /metrics already has every series the README names.
func TestTruncatedFetchSeriesExistFromTheStart(t *testing.T) {
	m := intake.NewMetrics(prometheus.NewRegistry())
	if n := testutil.CollectAndCount(m.TruncatedFetches, "backstop_truncated_fetches_total"); n != 3 {
		t.Errorf("%d truncated-fetch series before any fetch, want 3 (ok, error, gave_up)", n)
	}
}

// truncatedSetup starts a simulator with o, a client for it that does not
// retry, and a fresh store, all stopped at the test's end.
func truncatedSetup(t *testing.T, o sim.Options) (*sim.Sim, *sources.Client, *store.DB) {
	t.Helper()
	s := sim.New(o)
	api := httptest.NewServer(s.Handler())
	t.Cleanup(api.Close)
	client, err := sources.New(sources.Options{BaseURL: api.URL, APIKey: s.APIKey(), RetryMax: -1,
		Governor: governor.New(s.APIKey(), governor.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "t.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return s, client, db
}
