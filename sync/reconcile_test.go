package sync_test

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	stdsync "sync"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources"
	"github.com/backstop-sync/backstop/sources/governor"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
	bsync "github.com/backstop-sync/backstop/sync"
)

var _ bsync.ReconcileStore = (*store.DB)(nil)

// testClock is an engine clock the test moves.
type testClock struct {
	mu stdsync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// reconcileWorld is a sim over real HTTP, a real store and an engine whose
// clock the test holds.
func reconcileWorld(t *testing.T, objects, pageSize int) (*world, *testClock) {
	t.Helper()
	s := sim.New(sim.Options{Seed: 7, Objects: objects, BigObjects: -1})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "r.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	client, err := sources.New(sources.Options{BaseURL: srv.URL, APIKey: s.APIKey(), PageSize: pageSize,
		Governor: governor.New(s.APIKey(), governor.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	clk := &testClock{t: time.Now().UTC()}
	return &world{sim: s, db: db, engine: &bsync.Engine{Source: client, Mirror: db, PageSize: pageSize, Now: clk.Now}}, clk
}

var paymentRoutes = []backstop.Route{
	{Target: "billing", Events: []string{"payment.*"}},
	{Target: "support", Events: []string{"chat.*"}},
}

// damage fills the mirror with the sim's payments except every 7th
// (missing), then moves 8 of the mirrored ones on upstream (behind). It
// returns the ids of both, with the versions the sim now holds.
func damage(t *testing.T, w *world) (missing, behind map[string]backstop.Object) {
	t.Helper()
	ctx := context.Background()
	missing = make(map[string]backstop.Object)
	var kept []backstop.Object
	for i, o := range w.sim.Objects(backstop.Payments) {
		if i%7 == 3 {
			missing[o.ID] = o
			continue
		}
		kept = append(kept, o)
	}
	if err := w.db.InsertBatch(ctx, kept); err != nil {
		t.Fatal(err)
	}
	behind = make(map[string]backstop.Object)
	for _, o := range kept {
		if len(behind) == 8 {
			break
		}
		if nv, ok := w.sim.Update(backstop.Payments, o.ID); ok {
			behind[o.ID] = nv
		}
	}
	if len(behind) != 8 {
		t.Fatalf("could move only %d payments on", len(behind))
	}
	return missing, behind
}

// mirrorEqualsSim fails unless the mirror holds exactly the sim's payments,
// byte for byte.
func mirrorEqualsSim(t *testing.T, w *world) {
	t.Helper()
	got, err := w.db.Objects(context.Background(), backstop.Payments)
	if err != nil {
		t.Fatal(err)
	}
	want := w.sim.Objects(backstop.Payments)
	if len(got) != len(want) {
		t.Fatalf("mirror holds %d payments, sim %d", len(got), len(want))
	}
	for i := range want {
		if got[i].ID != want[i].ID || !got[i].UpdatedAt.Equal(want[i].UpdatedAt) || !bytes.Equal(got[i].Data, want[i].Data) {
			t.Fatalf("payment %d: mirror %s@%v, sim %s@%v (or data differs)", i, got[i].ID, got[i].UpdatedAt, want[i].ID, want[i].UpdatedAt)
		}
	}
}

func eventIDOf(o backstop.Object) string {
	return backstop.EventID(backstop.DedupKey(o.Resource, o.ID, o.UpdatedAt))
}

func pagesFor(n, pageSize int) int { return max(1, (n+pageSize-1)/pageSize) }

func TestReconcileRestoresMissingAndBehind(t *testing.T) {
	w, _ := reconcileWorld(t, 200, 10)
	ctx := context.Background()
	missing, behind := damage(t, w)
	opts := bsync.ReconcileOptions{Since: sim.BaseTime, Routes: paymentRoutes}

	rep, err := w.engine.Reconcile(ctx, backstop.Payments, opts)
	if err != nil {
		t.Fatal(err)
	}
	n := w.sim.Len(backstop.Payments)
	if rep.Scanned != n || rep.Missing != len(missing) || rep.Behind != len(behind) ||
		rep.Reemitted != len(missing)+len(behind) || rep.Suppressed != 0 || rep.Orphans != 0 {
		t.Fatalf("report %+v, want scanned %d, missing %d, behind %d, all re-emitted", rep, n, len(missing), len(behind))
	}
	if rep.Requests != rep.Pages || rep.Pages != pagesFor(n, 10) || rep.RateLimited != 0 {
		t.Errorf("requests=%d pages=%d, want one request per page and %d pages", rep.Requests, rep.Pages, pagesFor(n, 10))
	}
	if !rep.Since.Equal(sim.BaseTime) {
		t.Errorf("since=%v, want the given since", rep.Since)
	}
	mirrorEqualsSim(t, w)

	// One outbox row per re-emitted (payment, version), to the payment route only.
	want := make(map[string]backstop.Object)
	for _, m := range []map[string]backstop.Object{missing, behind} {
		for _, o := range m {
			want[eventIDOf(o)] = o
		}
	}
	rows, err := w.db.OutboxRows(ctx, "billing")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(want) {
		t.Fatalf("billing outbox has %d rows, want %d", len(rows), len(want))
	}
	for _, row := range rows {
		o, ok := want[row.EventID]
		if !ok {
			t.Fatalf("outbox row for unexpected event %s (%s)", row.EventID, row.EventType)
		}
		delete(want, row.EventID)
		if wt := backstop.EventTypeFor(backstop.Payments, o.Data, false); row.EventType != wt {
			t.Errorf("%s: event type %s, want %s", o.ID, row.EventType, wt)
		}
		pe, ok, err := w.db.ProcessedEvent(ctx, row.EventID)
		if err != nil || !ok || pe.Origin != backstop.OriginReconcile || pe.ObjectID != o.ID || !pe.UpdatedAt.Equal(o.UpdatedAt) {
			t.Errorf("processed event %s: %+v ok=%v err=%v, want origin reconcile for %s", row.EventID, pe, ok, err, o.ID)
		}
	}
	if rows, err := w.db.OutboxRows(ctx, "support"); err != nil {
		t.Fatal(err)
	} else if len(rows) != 0 {
		t.Errorf("support (chat.*) got %d payment events", len(rows))
	}

	// A second reconcile finds nothing to do.
	again, err := w.engine.Reconcile(ctx, backstop.Payments, opts)
	if err != nil {
		t.Fatal(err)
	}
	if again.Scanned != n || again.Missing != 0 || again.Behind != 0 || again.Reemitted != 0 || again.Suppressed != 0 {
		t.Errorf("second reconcile %+v, want everything scanned and nothing emitted", again)
	}

	// A webhook for a version reconcile already emitted is a duplicate.
	var o backstop.Object
	for _, o = range behind {
		break
	}
	res, err := w.db.Emit(ctx, []backstop.Event{{
		ID: "evt_webhook_late", Type: backstop.EventTypeFor(backstop.Payments, o.Data, false),
		Resource: backstop.Payments, ObjectID: o.ID, UpdatedAt: o.UpdatedAt, Origin: backstop.OriginWebhook, Data: o.Data,
	}}, paymentRoutes)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Status != backstop.EmitDuplicate {
		t.Errorf("late webhook for %s: %s, want duplicate", o.ID, res[0].Status)
	}
	if rows, _ := w.db.OutboxRows(ctx, "billing"); len(rows) != len(missing)+len(behind) {
		t.Errorf("billing outbox has %d rows after the late webhook, want still %d", len(rows), len(missing)+len(behind))
	}

	// Both runs are stored.
	runs, err := w.db.ReconcileRuns(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[1].Status != "ok" || runs[1].Reemitted != rep.Reemitted || runs[1].Missing != rep.Missing ||
		runs[1].Requests != rep.Requests || !runs[1].Since.Equal(sim.BaseTime) || runs[0].Reemitted != 0 {
		t.Errorf("stored runs %+v, want the two runs newest first", runs)
	}
}

// A dry run counts what it would emit and changes nothing.
func TestReconcileDryRun(t *testing.T) {
	w, _ := reconcileWorld(t, 100, 20)
	ctx := context.Background()
	missing, behind := damage(t, w)
	before, err := w.db.Objects(ctx, backstop.Payments)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := w.engine.Reconcile(ctx, backstop.Payments, bsync.ReconcileOptions{Since: sim.BaseTime, DryRun: true, Routes: paymentRoutes})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Missing != len(missing) || rep.Behind != len(behind) || rep.Reemitted != 0 || rep.Suppressed != 0 {
		t.Errorf("dry run %+v, want missing %d behind %d and nothing emitted", rep, len(missing), len(behind))
	}
	after, err := w.db.Objects(ctx, backstop.Payments)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Fatalf("dry run changed the mirror: %d -> %d payments", len(before), len(after))
	}
	for i := range before {
		if after[i].ID != before[i].ID || !after[i].UpdatedAt.Equal(before[i].UpdatedAt) {
			t.Fatalf("dry run changed payment %s", before[i].ID)
		}
	}
	if n, err := w.db.CountProcessed(ctx); err != nil || n != 0 {
		t.Errorf("dry run processed %d events (err %v), want none", n, err)
	}
	if rows, err := w.db.OutboxRows(ctx, "billing"); err != nil {
		t.Fatal(err)
	} else if len(rows) != 0 {
		t.Errorf("dry run queued %d deliveries", len(rows))
	}
	if _, ok, err := w.db.LastReconcile(ctx, backstop.Payments); err != nil || ok {
		t.Errorf("a dry run counts as the last reconcile (ok=%v err=%v)", ok, err)
	}
}

// --full reads the whole feed and counts mirror objects the platform no
// longer returns.
func TestReconcileFullCountsOrphans(t *testing.T) {
	w, _ := reconcileWorld(t, 150, 25)
	ctx := context.Background()
	objs := w.sim.Objects(backstop.Payments)
	ghost := objs[0]
	ghost.ID, ghost.Data = "pay_gone_1", []byte(`{"id":"pay_gone_1","status":"succeeded"}`)
	ghost2 := ghost
	ghost2.ID, ghost2.Data = "pay_gone_2", []byte(`{"id":"pay_gone_2","status":"failed"}`)
	if err := w.db.InsertBatch(ctx, append(objs, ghost, ghost2)); err != nil {
		t.Fatal(err)
	}
	rep, err := w.engine.Reconcile(ctx, backstop.Payments, bsync.ReconcileOptions{Full: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Orphans != 2 || rep.Scanned != len(objs) || !rep.Since.IsZero() || rep.Missing != 0 || rep.Behind != 0 {
		t.Errorf("full reconcile %+v, want 2 orphans, %d scanned from the start, nothing missing", rep, len(objs))
	}
	if rep.Requests != pagesFor(len(objs), 25) {
		t.Errorf("requests=%d, want %d pages", rep.Requests, pagesFor(len(objs), 25))
	}
	// Without --full nothing is counted.
	rep, err = w.engine.Reconcile(ctx, backstop.Payments, bsync.ReconcileOptions{Since: sim.BaseTime})
	if err != nil || rep.Orphans != 0 {
		t.Errorf("windowed reconcile: orphans=%d err=%v, want 0", rep.Orphans, err)
	}
	if _, err := w.engine.Reconcile(ctx, backstop.Payments, bsync.ReconcileOptions{Full: true, Since: sim.BaseTime}); err == nil {
		t.Error("full with since: no error")
	}
}

// The default window: 24h before now on a first run, then the start of the
// last successful non-dry run minus the lookback. Failed runs are stored
// and do not count.
func TestReconcileWindow(t *testing.T) {
	w, clk := reconcileWorld(t, 50, 10)
	ctx := context.Background()
	r := backstop.Payments
	t0 := clk.Now()
	// 25 payments change now, inside the first window: three pages.
	changed := 0
	for _, o := range w.sim.Objects(r) {
		if _, ok := w.sim.Update(r, o.ID); ok {
			changed++
		}
		if changed == 25 {
			break
		}
	}
	rep, err := w.engine.Reconcile(ctx, r, bsync.ReconcileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Since.Equal(t0.Add(-24*time.Hour)) || rep.Scanned != 25 || rep.Missing != 25 {
		t.Fatalf("first run: since %v scanned %d missing %d, want 24h before %v, the 25 changed", rep.Since, rep.Scanned, rep.Missing, t0)
	}

	clk.Add(time.Hour)
	if rep, err = w.engine.Reconcile(ctx, r, bsync.ReconcileOptions{Lookback: 30 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	if want := t0.Add(-30 * time.Minute); !rep.Since.Equal(want) {
		t.Errorf("second run since %v, want %v", rep.Since, want)
	}
	second := t0.Add(time.Hour)

	// A dry run and an interrupted run do not move the window.
	clk.Add(time.Hour)
	if rep, err = w.engine.Reconcile(ctx, r, bsync.ReconcileOptions{DryRun: true}); err != nil {
		t.Fatal(err)
	}
	if want := second.Add(-bsync.DefaultLookback); !rep.Since.Equal(want) {
		t.Errorf("third run since %v, want %v", rep.Since, want)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, err = w.engine.Reconcile(cctx, r, bsync.ReconcileOptions{Since: t0.Add(-time.Hour), OnPage: func(bsync.ReconcileReport) { cancel() }})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run: %v, want context.Canceled", err)
	}
	runs, err := w.db.ReconcileRuns(ctx, 1)
	if err != nil || len(runs) != 1 || runs[0].Status != "interrupted" || runs[0].Error == "" || runs[0].Pages != 1 {
		t.Fatalf("cancelled run stored as %+v (err %v), want interrupted after 1 page", runs, err)
	}
	last, ok, err := w.db.LastReconcile(ctx, r)
	if err != nil || !ok || !last.Equal(second) {
		t.Errorf("last reconcile %v ok=%v err=%v, want %v", last, ok, err, second)
	}
}

// Reconciling 100,000 payments keeps one page in memory: the live heap
// sampled during the run stays within a bound far below the feed's size, and
// it sends one request per page. The mirror is empty and the run is dry, so
// every object is compared and counted missing; under -race, writing 100,000
// objects into SQLite (as a prefilled mirror or as emitted events) would
// take minutes, and the emit path holds one page's events at a time anyway.
func TestReconcileLargeFeedHeapBound(t *testing.T) {
	const n, pageSize = 100_000, 200
	w, _ := reconcileWorld(t, n, pageSize)
	ctx := context.Background()
	feedBytes := 0
	for _, o := range w.sim.Objects(backstop.Payments) {
		feedBytes += len(o.Data)
	}

	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak uint64
	sample := func() {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapInuse)
	}
	rep, err := w.engine.Reconcile(ctx, backstop.Payments, bsync.ReconcileOptions{
		Since: sim.BaseTime, DryRun: true, Routes: paymentRoutes,
		OnPage: func(r bsync.ReconcileReport) {
			if r.Pages%100 == 0 {
				sample()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	sample()
	if rep.Scanned != n || rep.Missing != n || rep.Behind != 0 || rep.Reemitted != 0 {
		t.Fatalf("report %+v, want all %d scanned and missing, none emitted", rep, n)
	}
	if rep.Requests != rep.Pages || rep.Pages != pagesFor(n, pageSize) {
		t.Errorf("requests=%d pages=%d, want %d", rep.Requests, rep.Pages, pagesFor(n, pageSize))
	}
	growth := int64(peak) - int64(base)
	const bound = 8 << 20
	t.Logf("feed %d MiB; heap in use %d MiB before, peak growth %d KiB over %d pages",
		feedBytes>>20, base>>20, growth>>10, rep.Pages)
	if feedBytes <= 2*bound {
		t.Fatalf("the feed (%d bytes) is not well above the bound: the test proves nothing", feedBytes)
	}
	if growth > bound {
		t.Errorf("heap grew by %d MiB during the reconcile, want at most %d MiB", growth>>20, bound>>20)
	}
}

// webhookMidPage is the store as a reconcile sees it while the platform's
// webhooks keep arriving: right after the reconcile has read the mirror's
// versions of the page holding id, a webhook for a newer version of that
// object (update, then the sim's current object) commits through the emit
// path, before the reconcile emits the page.
type webhookMidPage struct {
	*store.DB
	id     string
	once   stdsync.Once
	update func() backstop.Object
	err    error
}

func (s *webhookMidPage) Versions(ctx context.Context, r backstop.Resource, ids []string) (map[string]time.Time, error) {
	v, err := s.DB.Versions(ctx, r, ids)
	for _, id := range ids {
		if id == s.id {
			s.once.Do(func() {
				o := s.update()
				_, s.err = s.DB.Emit(ctx, []backstop.Event{{
					ID: "evt_webhook_newer", Type: backstop.EventTypeFor(r, o.Data, false), Resource: r,
					ObjectID: o.ID, UpdatedAt: o.UpdatedAt, Origin: backstop.OriginWebhook, Data: o.Data,
				}}, paymentRoutes)
			})
		}
	}
	return v, err
}

// A webhook for a newer version of a payment that commits while a
// reconcile is between comparing the payment's page and emitting it wins:
// the reconcile does not queue the older version it read after the newer
// one (billing would take the payment back to its older status), and the
// mirror keeps the newer version.
func TestReconcileWebhookNewerVersionMidPage(t *testing.T) {
	w, _ := reconcileWorld(t, 60, 20)
	ctx := context.Background()
	r := backstop.Payments
	objs := w.sim.Objects(r)
	if err := w.db.InsertBatch(ctx, objs); err != nil {
		t.Fatal(err)
	}
	// Its webhook lost, a payment's next version (succeeded, which can
	// still be refunded) is only upstream.
	var read backstop.Object
	moved := 0 // payments behind in the mirror, read among them
	for _, o := range objs {
		if backstop.EventTypeFor(r, o.Data, false) != "payment.pending" {
			continue
		}
		nv, ok := w.sim.Update(r, o.ID)
		if ok {
			moved++
		}
		if ok && backstop.EventTypeFor(r, nv.Data, false) == "payment.succeeded" {
			read = nv
			break
		}
	}
	if read.ID == "" {
		t.Fatal("no payment went from pending to succeeded")
	}
	var newer backstop.Object
	mid := &webhookMidPage{DB: w.db, id: read.ID, update: func() backstop.Object {
		newer, _ = w.sim.Update(r, read.ID)
		return newer
	}}
	// No ReconcileEmitter: the Mirror (the store, here wrapped) is one.
	w.engine.Mirror = mid
	rep, err := w.engine.Reconcile(ctx, r, bsync.ReconcileOptions{Since: sim.BaseTime, Routes: paymentRoutes})
	if err != nil || mid.err != nil {
		t.Fatalf("reconcile: %v; webhook: %v", err, mid.err)
	}
	if !newer.UpdatedAt.After(read.UpdatedAt) {
		t.Fatalf("the webhook's version %v is not after the one read %v", newer.UpdatedAt, read.UpdatedAt)
	}
	rows, err := w.db.OutboxRows(ctx, "billing")
	if err != nil {
		t.Fatal(err)
	}
	webhooks := 0
	for _, row := range rows {
		if row.EventID == "evt_webhook_newer" {
			webhooks++
		}
		if row.EventID == eventIDOf(read) {
			t.Errorf("the older version %v read by the reconcile was queued (%s) after the webhook's newer %v", read.UpdatedAt, row.EventType, newer.UpdatedAt)
		}
	}
	if len(rows) != moved || webhooks != 1 {
		t.Errorf("billing outbox %d rows, want the webhook's and the %d other payments behind", len(rows), moved-1)
	}
	if pe, ok, err := w.db.ProcessedEvent(ctx, eventIDOf(read)); err != nil || ok {
		t.Errorf("the older version was processed (origin %s) ok=%v err=%v", pe.Origin, ok, err)
	}
	mirrorEqualsSim(t, w)
	if rep.Behind != moved || rep.Reemitted != moved-1 || rep.Suppressed != 1 {
		t.Errorf("report behind=%d reemitted=%d suppressed=%d, want %d behind, one suppressed by the newer version", rep.Behind, rep.Reemitted, rep.Suppressed, moved)
	}
	runs, err := w.db.ReconcileRuns(ctx, 1)
	if err != nil || len(runs) != 1 || runs[0].Suppressed != 1 || runs[0].Reemitted != moved-1 {
		t.Errorf("stored run %+v (err %v), want 1 suppressed", runs, err)
	}
}
