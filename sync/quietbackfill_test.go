package sync_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources"
	"github.com/backstop-sync/backstop/sources/governor"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
	bsync "github.com/backstop-sync/backstop/sync"
)

var billingRoutes = []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}

// quietWorld is a sim of 40 payments over real HTTP, a real store and an
// engine (pages of 10) that all read the clock the test holds, set well
// after the sim's seed history.
func quietWorld(t *testing.T) (*world, *testClock) {
	t.Helper()
	return quietWorldWrapped(t, nil)
}

// quietWorldWrapped is quietWorld with the sim's handler wrapped by wrap
// (when not nil).
func quietWorldWrapped(t *testing.T, wrap func(http.Handler) http.Handler) (*world, *testClock) {
	t.Helper()
	clk := &testClock{t: sim.BaseTime.AddDate(0, 3, 0)}
	s := sim.New(sim.Options{Seed: 11, Objects: 40, BigObjects: -1, Now: clk.Now})
	var h http.Handler = s.Handler()
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "q.db"), store.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	client, err := sources.New(sources.Options{BaseURL: srv.URL, APIKey: s.APIKey(), PageSize: 10,
		Governor: governor.New(s.APIKey(), governor.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	return &world{sim: s, db: db, engine: &bsync.Engine{Source: client, Mirror: db, PageSize: 10, Now: clk.Now}}, clk
}

// interruptQuietBackfill starts a backfill of payments without events and
// cancels it once its first page is committed, as Ctrl-C would.
func interruptQuietBackfill(t *testing.T, w *world) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w.engine.OnPage = func(backstop.RunStats) { cancel() }
	defer func() { w.engine.OnPage = nil }()
	st, _, err := w.engine.BackfillQuiet(ctx, backstop.Payments, false, billingRoutes)
	if !errors.Is(err, context.Canceled) || st.Pages != 1 {
		t.Fatalf("interrupted backfill: %d pages, %v; want cancelled after its first", st.Pages, err)
	}
}

// updatePayment makes the next version of the first payment that can
// still change among objs for which pick is true.
func updatePayment(t *testing.T, w *world, objs []backstop.Object, pick func(backstop.Object) bool) backstop.Object {
	t.Helper()
	for _, o := range objs {
		if !pick(o) {
			continue
		}
		if u, ok := w.sim.Update(backstop.Payments, o.ID); ok {
			return u
		}
	}
	t.Fatal("no payment could change")
	return backstop.Object{}
}

// A backfill without events that was interrupted and resumed an hour later
// used to take the resume's time as its start: the changes made on the
// platform while it was stopped were older than that (less QuietMargin),
// so it wrote them into the mirror without their events, which never
// reached the targets, and reconcile found the mirror up to date. The
// checkpoint now keeps the first run's start: the resumed run emits those
// changes (origin sync), and still writes the history silently.
func TestResumedQuietBackfillEmitsChangesMadeWhileStopped(t *testing.T) {
	ctx := context.Background()
	w, clk := quietWorld(t)
	first := clk.Now()
	history := w.sim.Objects(backstop.Payments)

	interruptQuietBackfill(t, w)
	chk := w.cursor(t, backstop.Payments, backstop.CursorBackfill)
	if !chk.StartedAt.Equal(first) {
		t.Errorf("checkpoint StartedAt = %v, want the backfill's start %v", chk.StartedAt, first)
	}

	// While it is stopped, two payments change: one it had read, one it
	// had not. Either way the new version is at the end of the feed,
	// beyond the checkpoint, for the resumed run to read.
	clk.Add(5 * time.Minute)
	read := updatePayment(t, w, history, func(o backstop.Object) bool { return o.Position().Compare(chk.Position) <= 0 })
	unread := updatePayment(t, w, history, func(o backstop.Object) bool { return o.Position().Compare(chk.Position) > 0 })
	changed := map[string]backstop.Object{eventIDOf(read): read, eventIDOf(unread): unread}

	// Resumed an hour later: the changes are older than the resume less
	// QuietMargin, but newer than the first run's start.
	clk.Add(time.Hour)
	st, em, err := w.engine.BackfillQuiet(ctx, backstop.Payments, false, billingRoutes)
	if err != nil {
		t.Fatal(err)
	}
	if em.Emitted != len(changed) {
		t.Errorf("resumed backfill emitted %d, want %d (the changes made while it was stopped)", em.Emitted, len(changed))
	}
	if st.Pages == 0 {
		t.Errorf("resumed backfill read no page")
	}
	mirrorEqualsSim(t, w)
	rows, err := w.db.OutboxRows(ctx, "billing")
	if err != nil {
		t.Fatal(err)
	}
	// Exactly the two changes: the history, older than the first start
	// less QuietMargin, is written without events.
	if len(rows) != len(changed) {
		t.Errorf("billing outbox has %d rows, want %d", len(rows), len(changed))
	}
	for _, row := range rows {
		o, ok := changed[row.EventID]
		if !ok {
			t.Errorf("outbox row for an unexpected event %s (%s)", row.EventID, row.EventType)
			continue
		}
		pe, ok, err := w.db.ProcessedEvent(ctx, row.EventID)
		if err != nil || !ok || pe.Origin != backstop.OriginSync || pe.ObjectID != o.ID || !pe.UpdatedAt.Equal(o.UpdatedAt) {
			t.Errorf("processed event %s: %+v ok=%v err=%v, want origin sync for %s", row.EventID, pe, ok, err, o.ID)
		}
	}
	done := w.cursor(t, backstop.Payments, backstop.CursorBackfill)
	if !done.Done || !done.StartedAt.Equal(first) {
		t.Errorf("finished checkpoint: done=%v StartedAt=%v, want done, started at %v", done.Done, done.StartedAt, first)
	}
	if sc := w.cursor(t, backstop.Payments, backstop.CursorSync); !sc.StartedAt.IsZero() {
		t.Errorf("sync cursor StartedAt = %v, want none (a backfill checkpoint's alone)", sc.StartedAt)
	}

	// --restart begins a new checkpoint, with its own start.
	clk.Add(time.Hour)
	restart := clk.Now()
	if _, _, err := w.engine.BackfillQuiet(ctx, backstop.Payments, true, billingRoutes); err != nil {
		t.Fatal(err)
	}
	if c := w.cursor(t, backstop.Payments, backstop.CursorBackfill); !c.StartedAt.Equal(restart) {
		t.Errorf("checkpoint StartedAt after --restart = %v, want the restart's %v", c.StartedAt, restart)
	}
}

// A restart (backfill --restart) does not keep the start of the checkpoint
// it discards: it is a new first fill, whose history is what came before
// it (less QuietMargin), so a change made an hour before it, while the
// old backfill was stopped, is written without an event.
func TestRestartedQuietBackfillTakesItsOwnStart(t *testing.T) {
	ctx := context.Background()
	w, clk := quietWorld(t)
	history := w.sim.Objects(backstop.Payments)
	interruptQuietBackfill(t, w)

	clk.Add(5 * time.Minute)
	updatePayment(t, w, history, func(backstop.Object) bool { return true })
	clk.Add(time.Hour)
	restart := clk.Now()
	_, em, err := w.engine.BackfillQuiet(ctx, backstop.Payments, true, billingRoutes)
	if err != nil {
		t.Fatal(err)
	}
	if em.Emitted != 0 {
		t.Errorf("restarted backfill emitted %d, want 0: the change is older than its start less QuietMargin", em.Emitted)
	}
	mirrorEqualsSim(t, w)
	if c := w.cursor(t, backstop.Payments, backstop.CursorBackfill); !c.Done || !c.StartedAt.Equal(restart) {
		t.Errorf("checkpoint after --restart: done=%v StartedAt=%v, want done, started at %v", c.Done, c.StartedAt, restart)
	}
}

// A backfill without events stopped before its first page was committed
// (its first request unanswered, or queued behind the other resources of
// the run) saved no checkpoint, so its resume took its own start: what
// changed while it was stopped was written without events (found by an
// operator audit: 17 chats and 34 messages never reached the target). The
// checkpoint is now begun, with its start, before the first request.
func TestQuietBackfillStoppedBeforeItsFirstPageKeepsItsStart(t *testing.T) {
	ctx := context.Background()
	arrived := make(chan struct{}, 1)
	var hold atomic.Bool
	hold.Store(true)
	w, clk := quietWorldWrapped(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			if hold.Load() {
				select {
				case arrived <- struct{}{}:
				default:
				}
				<-r.Context().Done() // unanswered until the run gives up
				return
			}
			h.ServeHTTP(rw, r)
		})
	})
	first := clk.Now()
	history := w.sim.Objects(backstop.Payments)

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, _, err := w.engine.BackfillQuiet(runCtx, backstop.Payments, false, billingRoutes)
		done <- err
	}()
	<-arrived
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("backfill stopped at its first request: %v, want cancelled", err)
	}
	hold.Store(false)
	chk := w.cursor(t, backstop.Payments, backstop.CursorBackfill)
	if !chk.StartedAt.Equal(first) || chk.Value != "" || chk.Done {
		t.Fatalf("checkpoint after a backfill stopped before its first page: %+v, want begun at the start of the feed, started %v", chk, first)
	}

	clk.Add(5 * time.Minute)
	changed := updatePayment(t, w, history, func(backstop.Object) bool { return true })
	clk.Add(time.Hour)
	_, em, err := w.engine.BackfillQuiet(ctx, backstop.Payments, false, billingRoutes)
	if err != nil {
		t.Fatal(err)
	}
	if em.Emitted != 1 {
		t.Errorf("resumed backfill emitted %d, want 1 (the change made while it was stopped)", em.Emitted)
	}
	mirrorEqualsSim(t, w)
	rows, err := w.db.OutboxRows(ctx, "billing")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].EventID != eventIDOf(changed) {
		t.Errorf("billing outbox: %d rows (%+v), want the one change %s", len(rows), rows, eventIDOf(changed))
	}
}
