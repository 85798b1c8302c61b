package intake_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path"
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
	emitTruncated(t, db, ev, routes)

	metrics := intake.NewMetrics(prometheus.NewRegistry())
	now := time.Now()
	clock := func() time.Time { return now }
	f, _ := runFetcher(t, db, client, intake.FetcherOptions{Routes: routes, Metrics: metrics, Now: clock, Interval: time.Hour})

	// First the API fails: the fetch is retried later, and the failure shows.
	s.SetErrorRate(1)
	f.Wake()
	waitFor(t, func() bool {
		pe := processed(t, db, "evt_trunc")
		return pe.FetchAttempts >= 1
	})
	pe := processed(t, db, "evt_trunc")
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
		pe := processed(t, db, "evt_trunc")
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
	ev := truncatedPayment(t, "evt_gone", "pay_doesnotexist")
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	emitTruncated(t, db, ev, routes)

	metrics := intake.NewMetrics(prometheus.NewRegistry())
	var mu sync.Mutex
	now := created.Add(time.Minute) // the object may still be on its way
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	f, _ := runFetcher(t, db, client, intake.FetcherOptions{Routes: routes, Metrics: metrics, Now: clock, Interval: time.Hour})

	// Within the grace a 404 is retried like any failure.
	waitFor(t, func() bool {
		pe := processed(t, db, "evt_gone")
		return pe.FetchAttempts >= 1
	})
	pe := processed(t, db, "evt_gone")
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
		pe := processed(t, db, "evt_gone")
		return !pe.Truncated
	})
	pe = processed(t, db, "evt_gone")
	if !strings.HasPrefix(pe.LastFetchError, "given up") || pe.FetchAttempts < 2 {
		t.Fatalf("given-up event: %+v", pe)
	}
	// Counted once the store has it: wait for the count too.
	waitFor(t, func() bool { return testutil.ToFloat64(metrics.TruncatedFetches.WithLabelValues("gave_up")) >= 1 })
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

// A truncated event whose created_at is ahead of its arrival (the sender's
// clock is wrong) and whose object the platform does not have is given up
// NotFoundGrace after it arrived. The grace used to run from created_at
// alone, so a created_at a year ahead kept the 404 retried for a year, the
// event pending all along.
func TestTruncatedEventFromTheFutureWithoutObjectIsGivenUp(t *testing.T) {
	_, client, db := truncatedSetup(t, sim.Options{Seed: 3, Objects: 20})
	received := time.Now()
	body := []byte(`{"event_id":"evt_ahead","event":"payment.succeeded","created_at":"` +
		received.AddDate(1, 0, 0).UTC().Format(time.RFC3339) + `","truncated":true,"data":{"id":"pay_doesnotexist"}}`)
	ev, err := intake.ParseEnvelope(body)
	if err != nil {
		t.Fatal(err)
	}
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	emitTruncated(t, db, ev, routes)

	// Two hours after it arrived, the object is still missing.
	metrics := intake.NewMetrics(prometheus.NewRegistry())
	clock := func() time.Time { return received.Add(2 * time.Hour) }
	runFetcher(t, db, client, intake.FetcherOptions{Routes: routes, Metrics: metrics, Now: clock, Interval: time.Hour})

	waitFor(t, func() bool {
		pe := processed(t, db, "evt_ahead")
		return pe.FetchAttempts >= 1
	})
	pe := processed(t, db, "evt_ahead")
	if pe.Truncated || !strings.HasPrefix(pe.LastFetchError, "given up") {
		t.Fatalf("404 two hours after arrival, created_at a year ahead: %+v; want it given up", pe)
	}
	// Counted once the store has it: wait for the count too.
	waitFor(t, func() bool { return testutil.ToFloat64(metrics.TruncatedFetches.WithLabelValues("gave_up")) >= 1 })
	if got := testutil.ToFloat64(metrics.TruncatedFetches.WithLabelValues("gave_up")); got != 1 {
		t.Errorf("gave_up fetches metric = %v, want 1", got)
	}
	if n, err := db.CountTruncatedPending(context.Background()); err != nil || n != 0 {
		t.Errorf("truncated pending = %d (%v), want 0", n, err)
	}
}

// A truncated event whose object the platform answers 410 Gone (deleted)
// is given up at its first fetch, without waiting out NotFoundGrace: no
// retry can bring a deleted object back. It used to be retried every 5
// minutes for as long as the process ran, pending all along.
func TestTruncatedEventWhoseObjectIsGoneIsGivenUp(t *testing.T) {
	s := sim.New(sim.Options{Seed: 3, Objects: 20})
	var gets sync.Map // path -> struct{}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/public/v1/payments/pay_deleted" {
			gets.Store(r.URL.Path, struct{}{})
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusGone)
			w.Write([]byte(`{"error":{"code":"gone","message":"payment pay_deleted was deleted"}}`))
			return
		}
		s.Handler().ServeHTTP(w, r)
	}))
	defer api.Close()
	client, err := sources.New(sources.Options{BaseURL: api.URL, APIKey: s.APIKey(), RetryMax: -1,
		Governor: governor.New(s.APIKey(), governor.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "t.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ev := truncatedPayment(t, "evt_deleted", "pay_deleted")
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	emitTruncated(t, db, ev, routes)

	// A minute after the event: within the grace a 404 would be retried.
	metrics := intake.NewMetrics(prometheus.NewRegistry())
	clock := func() time.Time { return ev.CreatedAt.Add(time.Minute) }
	runFetcher(t, db, client, intake.FetcherOptions{Routes: routes, Metrics: metrics, Now: clock, Interval: time.Hour})

	waitFor(t, func() bool {
		pe := processed(t, db, "evt_deleted")
		return pe.FetchAttempts >= 1
	})
	pe := processed(t, db, "evt_deleted")
	if pe.Truncated || !strings.HasPrefix(pe.LastFetchError, "given up") || !strings.Contains(pe.LastFetchError, "410") {
		t.Fatalf("after a 410 Gone: %+v; want it given up, saying 410", pe)
	}
	waitFor(t, func() bool { return testutil.ToFloat64(metrics.TruncatedFetches.WithLabelValues("gave_up")) >= 1 })
	if got := testutil.ToFloat64(metrics.TruncatedFetches.WithLabelValues("error")); got != 0 {
		t.Errorf("error fetches metric = %v, want 0", got)
	}
	if rows, err := db.OutboxRows(context.Background(), "billing"); err != nil || len(rows) != 0 {
		t.Errorf("outbox of a given-up event: %v %+v, want none", err, rows)
	}
	if _, ok := gets.Load("/public/v1/payments/pay_deleted"); !ok {
		t.Error("the deleted payment was never asked for")
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

// processed returns the stored event id, failing the test when the store
// cannot read it or holds no such event: a wait on it would otherwise take
// a missing row, or an error, for a completed fetch.
func processed(t *testing.T, db *store.DB, id string) store.ProcessedEvent {
	t.Helper()
	pe, ok, err := db.ProcessedEvent(context.Background(), id)
	if err != nil {
		t.Fatalf("processed event %s: %v", id, err)
	}
	if !ok {
		t.Fatalf("processed event %s: not stored", id)
	}
	return pe
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
	client, db := truncatedSetupOver(t, s, s.Handler())
	return s, client, db
}

// truncatedSetupOver is truncatedSetup with the simulator s served by h
// (s's handler, or one in front of it).
func truncatedSetupOver(t *testing.T, s *sim.Sim, h http.Handler) (*sources.Client, *store.DB) {
	t.Helper()
	api := httptest.NewServer(h)
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
	return client, db
}

// truncatedPayment is a truncated payment.succeeded webhook, eventID,
// created 2026-03-01T10:00:00Z, whose data names only the payment objectID.
func truncatedPayment(t *testing.T, eventID, objectID string) backstop.Event {
	t.Helper()
	body := []byte(`{"event_id":"` + eventID + `","event":"payment.succeeded","created_at":"2026-03-01T10:00:00Z","truncated":true,"data":{"id":"` + objectID + `"}}`)
	ev, err := intake.ParseEnvelope(body)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// emitTruncated stores ev in db for routes and fails the test unless it
// is accepted.
func emitTruncated(t *testing.T, db *store.DB, ev backstop.Event, routes []backstop.Route) {
	t.Helper()
	if res, err := db.Emit(context.Background(), []backstop.Event{ev}, routes); err != nil || res[0].Status != backstop.EmitAccepted {
		t.Fatalf("emit truncated: %v %v", res, err)
	}
}

// sharedStoreFetchers is a simulator with latency behind a server that counts
// the GETs of each object, a store file, and a shared fake clock, for
// fetchers running as separate processes would: each on its own handle on
// the file.
type sharedStoreFetchers struct {
	t      *testing.T
	sim    *sim.Sim
	client *sources.Client
	path   string

	mu   sync.Mutex
	gets map[string]int // by object id
	now  time.Time
}

// newSharedStoreFetchers starts the simulator, answering after latency, and
// the counting server; the clock starts at start.
func newSharedStoreFetchers(t *testing.T, start time.Time, latency time.Duration) *sharedStoreFetchers {
	t.Helper()
	s := sim.New(sim.Options{Seed: 3, Objects: 20, Latency: latency})
	h := &sharedStoreFetchers{t: t, sim: s, path: filepath.Join(t.TempDir(), "shared.db"), gets: map[string]int{}, now: start}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			h.mu.Lock()
			h.gets[path.Base(r.URL.Path)]++
			h.mu.Unlock()
		}
		s.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(api.Close)
	var err error
	h.client, err = sources.New(sources.Options{BaseURL: api.URL, APIKey: s.APIKey(), RetryMax: -1,
		Governor: governor.New(s.APIKey(), governor.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *sharedStoreFetchers) clock() time.Time { h.mu.Lock(); defer h.mu.Unlock(); return h.now }

func (h *sharedStoreFetchers) setClock(t time.Time) { h.mu.Lock(); h.now = t; h.mu.Unlock() }

func (h *sharedStoreFetchers) getsOf(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gets[id]
}

// open opens another handle on the store file, as another process would.
func (h *sharedStoreFetchers) open() *store.DB {
	h.t.Helper()
	db, err := store.Open(context.Background(), h.path, store.Options{})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { db.Close() })
	return db
}

// start runs a fetcher over db, polling every few milliseconds; the
// returned func stops it and waits for it to return.
func (h *sharedStoreFetchers) start(db *store.DB, routes []backstop.Route, metrics *intake.Metrics) (stop func()) {
	_, stop = runFetcher(h.t, db, h.client, intake.FetcherOptions{Routes: routes, Metrics: metrics, Now: h.clock,
		Interval: 5 * time.Millisecond})
	return stop
}

// runFetcher runs a fetcher over db with opts until stop (or the end of
// the test) stops it and waits for it to return.
func runFetcher(t *testing.T, db *store.DB, client *sources.Client, opts intake.FetcherOptions) (f *intake.Fetcher, stop func()) {
	f = intake.NewFetcher(db, client, opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return f, stop
}

// Two serve processes on one store: a truncated event whose object is still
// missing is fetched once per backoff step, not once per process, and the
// backoff (1, 2, 4, 8 s) follows the attempts stored with the event; a
// process started afterwards goes on from them instead of starting over.
func TestTruncatedFetchOncePerStepAcrossProcesses(t *testing.T) {
	created := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	// The latency keeps each fetch in flight long enough for another
	// process's fetcher, polling every few milliseconds, to see the event.
	h := newSharedStoreFetchers(t, created.Add(time.Minute), 200*time.Millisecond) // within the not-found grace
	ev := truncatedPayment(t, "evt_gone", "pay_notyet")
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	a, b := h.open(), h.open()
	emitTruncated(t, a, ev, routes)
	stopA := h.start(a, routes, nil)
	stopB := h.start(b, routes, nil)

	// step waits for the k-th fetch to be recorded, checks that it was the
	// k-th GET and that the next one is due wait later, and returns when
	// that is (the caller moves the clock to it).
	step := func(k int, wait time.Duration) time.Time {
		t.Helper()
		waitFor(t, func() bool {
			pe := processed(t, a, "evt_gone")
			return pe.FetchAttempts >= k
		})
		pe, _, err := b.ProcessedEvent(context.Background(), "evt_gone")
		if err != nil {
			t.Fatal(err)
		}
		if got := h.getsOf("pay_notyet"); pe.FetchAttempts != k || got != k {
			t.Fatalf("step %d: %d attempts recorded and %d GETs, want %d of each (one fetch per step, not one per process)",
				k, pe.FetchAttempts, got, k)
		}
		if want := h.clock().Add(wait); !pe.Truncated || !pe.NextFetchAt.Equal(want) {
			t.Fatalf("step %d: truncated=%v, next fetch at %v, want %v (retry in %v)", k, pe.Truncated, pe.NextFetchAt, want, wait)
		}
		return pe.NextFetchAt
	}
	var next time.Time
	for k, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second} {
		if k > 0 {
			h.setClock(next)
		}
		next = step(k+1, wait)
	}

	// Both stop (a rolling deploy); a new process continues the schedule.
	// The clock moves on once they have stopped: a fetch they began as
	// they stopped would be a GET handed back unrecorded.
	stopA()
	stopB()
	h.start(h.open(), routes, nil)
	h.setClock(next)
	h.setClock(step(5, 16*time.Second))
	step(6, 32*time.Second)
}

// Two serve processes on one store: a truncated event whose object exists
// is fetched once and completed once: one GET, one "ok", one outbox row.
func TestTruncatedEventCompletedOnceAcrossProcesses(t *testing.T) {
	h := newSharedStoreFetchers(t, time.Now(), 200*time.Millisecond)
	pay := h.sim.Objects(backstop.Payments)[0]
	ev := truncatedPayment(t, "evt_big", pay.ID)
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	a, b := h.open(), h.open()
	ma, mb := intake.NewMetrics(prometheus.NewRegistry()), intake.NewMetrics(prometheus.NewRegistry())
	stopA := h.start(a, routes, ma)
	stopB := h.start(b, routes, mb)
	emitTruncated(t, a, ev, routes)
	waitFor(t, func() bool {
		pe := processed(t, b, "evt_big")
		return !pe.Truncated
	})
	stopA()
	stopB() // every fetch in flight has ended
	if got := h.getsOf(pay.ID); got != 1 {
		t.Errorf("%d GETs of the object, want 1", got)
	}
	ok := testutil.ToFloat64(ma.TruncatedFetches.WithLabelValues("ok")) + testutil.ToFloat64(mb.TruncatedFetches.WithLabelValues("ok"))
	if ok != 1 {
		t.Errorf("result=\"ok\" counted %v times over both processes, want 1", ok)
	}
	if rows, err := a.OutboxRows(context.Background(), "billing"); err != nil || len(rows) != 1 {
		t.Errorf("outbox: %v, %d rows, want 1", err, len(rows))
	}
}

// A process stopped mid-fetch hands its claim back: another process
// fetches the event at once instead of when the claim's lease would end.
func TestTruncatedFetchStoppedMidwayIsHandedBack(t *testing.T) {
	h := newSharedStoreFetchers(t, time.Now(), 2*time.Second) // long enough to stop the fetch midway
	pay := h.sim.Objects(backstop.Payments)[0]
	ev := truncatedPayment(t, "evt_big", pay.ID)
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	a, b := h.open(), h.open()
	emitTruncated(t, a, ev, routes)
	stopA := h.start(a, routes, nil)
	waitFor(t, func() bool { return h.getsOf(pay.ID) == 1 }) // in flight (the API's latency)
	stopA()
	pe, _, err := b.ProcessedEvent(context.Background(), "evt_big")
	if err != nil || !pe.Truncated || pe.FetchAttempts != 0 || pe.NextFetchAt.After(h.clock()) {
		t.Fatalf("after a stop mid-fetch: %+v, %v; want it due now, no attempt counted", pe, err)
	}
	h.start(b, routes, nil) // the clock stands still: only a handed-back claim is due
	waitFor(t, func() bool {
		pe := processed(t, b, "evt_big")
		return !pe.Truncated
	})
	if got := h.getsOf(pay.ID); got != 2 {
		t.Errorf("%d GETs of the object, want 2", got)
	}
}

// An object whose fetch hangs (the platform slow on it, up to the fetch's
// timeout) does not hold up the other truncated events: they are fetched
// and completed meanwhile, and the slow one completes when its answer
// comes.
func TestSlowTruncatedFetchDoesNotHoldUpOthers(t *testing.T) {
	s := sim.New(sim.Options{Seed: 3, Objects: 20})
	pays := s.Objects(backstop.Payments)
	slowID, fastID := pays[0].ID, pays[1].ID
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	client, db := truncatedSetupOver(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && path.Base(r.URL.Path) == slowID {
			once.Do(func() { close(started) })
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		s.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	// The governor holds every request while a key's first one, which
	// learns its budget, is in flight: one answered first.
	if _, _, err := client.Get(context.Background(), backstop.Payments, pays[2].ID); err != nil {
		t.Fatal(err)
	}
	routes := []backstop.Route{{Target: "crm", Events: []string{"payment.*"}}}
	f, _ := runFetcher(t, db, client, intake.FetcherOptions{Routes: routes, Interval: 5 * time.Millisecond})

	emitTruncated(t, db, truncatedPayment(t, "evt_slow", slowID), routes)
	f.Wake()
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("the slow object's fetch did not start in 20s")
	}
	emitTruncated(t, db, truncatedPayment(t, "evt_fast", fastID), routes)
	f.Wake()
	waitFor(t, func() bool {
		pe := processed(t, db, "evt_fast")
		return !pe.Truncated
	})
	if pe := processed(t, db, "evt_slow"); !pe.Truncated {
		t.Fatalf("the slow event completed before its answer: %+v", pe)
	}
	close(release)
	waitFor(t, func() bool {
		pe := processed(t, db, "evt_slow")
		return !pe.Truncated
	})
	rows, err := db.OutboxRows(context.Background(), "crm")
	if err != nil || len(rows) != 2 {
		t.Fatalf("outbox: %v, %d rows, want 2", err, len(rows))
	}
}
