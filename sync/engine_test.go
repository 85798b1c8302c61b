package sync_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources"
	"github.com/backstop-sync/backstop/sources/governor"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
	bsync "github.com/backstop-sync/backstop/sync"
)

type world struct {
	sim    *sim.Sim
	db     *store.DB
	engine *bsync.Engine
}

func newWorld(t *testing.T, objects int) *world {
	t.Helper()
	s := sim.New(sim.Options{Seed: 21, Objects: objects})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "m.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	client, err := sources.New(sources.Options{BaseURL: srv.URL, APIKey: s.APIKey(), PageSize: 10,
		Governor: governor.New(s.APIKey(), governor.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	return &world{sim: s, db: db, engine: &bsync.Engine{Source: client, Mirror: db, PageSize: 10}}
}

func (w *world) cursor(t *testing.T, r backstop.Resource, kind backstop.CursorKind) backstop.Cursor {
	t.Helper()
	c, ok, err := w.db.Cursor(context.Background(), r, kind)
	if err != nil || !ok {
		t.Fatalf("%s %s cursor: ok=%v err=%v", r, kind, ok, err)
	}
	return c
}

func lastPosition(s *sim.Sim, r backstop.Resource) backstop.Position {
	objs := s.Objects(r)
	return objs[len(objs)-1].Position()
}

// A backfill never moves the incremental cursor backwards: not while it runs,
// not when it is interrupted, not when it finishes behind it.
func TestBackfillNeverMovesSyncCursorBack(t *testing.T) {
	w := newWorld(t, 200)
	ctx := context.Background()
	r := backstop.Payments
	if _, err := w.engine.Sync(ctx, r); err != nil {
		t.Fatal(err)
	}
	end := w.cursor(t, r, backstop.CursorSync)
	if end.Position != lastPosition(w.sim, r) {
		t.Fatalf("sync cursor at %v, want the end of the feed %v", end.Position, lastPosition(w.sim, r))
	}

	// Interrupt a backfill after three pages.
	bctx, cancel := context.WithCancel(ctx)
	w.engine.OnPage = func(st backstop.RunStats) {
		if st.Pages == 3 {
			cancel()
		}
	}
	st, err := w.engine.Backfill(bctx, r, false)
	w.engine.OnPage = nil
	if !errors.Is(err, context.Canceled) || st.Pages != 3 {
		t.Fatalf("interrupted backfill: pages=%d err=%v, want 3 pages and context.Canceled", st.Pages, err)
	}
	if got := w.cursor(t, r, backstop.CursorSync); got != end {
		t.Fatalf("interrupted backfill moved the sync cursor from %v to %v", end.Position, got.Position)
	}
	chk := w.cursor(t, r, backstop.CursorBackfill)
	if chk.Done || chk.Position != w.sim.Objects(r)[29].Position() {
		t.Fatalf("checkpoint after 3 pages of 10: %+v, want at object 30, not done", chk)
	}

	// The platform moves on; sync follows it.
	w.sim.Mutate(40)
	if _, err := w.engine.Sync(ctx, r); err != nil {
		t.Fatal(err)
	}
	later := w.cursor(t, r, backstop.CursorSync)

	// The resumed backfill starts at its checkpoint, not at the start.
	st, err = w.engine.Backfill(ctx, r, false)
	if err != nil {
		t.Fatal(err)
	}
	after := 0
	for _, o := range w.sim.Objects(r) {
		if o.Position().Compare(chk.Position) > 0 {
			after++
		}
	}
	if st.Objects != after {
		t.Errorf("resumed backfill read %d objects, want the %d after its checkpoint", st.Objects, after)
	}
	if got := w.cursor(t, r, backstop.CursorSync); got.Position != later.Position || got.Value != later.Value {
		t.Errorf("finished backfill changed a sync cursor that was not behind: %v -> %v", later.Position, got.Position)
	}
	if !w.cursor(t, r, backstop.CursorBackfill).Done {
		t.Error("finished backfill's checkpoint is not marked done")
	}

	// A finished backfill is not run again...
	st, err = w.engine.Backfill(ctx, r, false)
	if err != nil || st.Requests != 0 {
		t.Errorf("backfill after a finished one: requests=%d err=%v, want nothing done", st.Requests, err)
	}
	// ...unless restarted, which reads everything and writes nothing new.
	st, err = w.engine.Backfill(ctx, r, true)
	if err != nil {
		t.Fatal(err)
	}
	if st.Objects != len(w.sim.Objects(r)) || st.New != 0 || st.Updated != 0 {
		t.Errorf("restarted full backfill: objects=%d new=%d updated=%d, want all read, none written", st.Objects, st.New, st.Updated)
	}
	if got := w.cursor(t, r, backstop.CursorSync); got.Position != later.Position {
		t.Errorf("restarted backfill moved the sync cursor %v -> %v", later.Position, got.Position)
	}
}

// On a fresh mirror a backfill hands its end position to the sync cursor, so
// the next sync reads only later changes.
func TestBackfillHandsOffToSync(t *testing.T) {
	w := newWorld(t, 120)
	ctx := context.Background()
	r := backstop.Contacts
	if _, err := w.engine.Backfill(ctx, r, false); err != nil {
		t.Fatal(err)
	}
	if got := w.cursor(t, r, backstop.CursorSync); got.Position != lastPosition(w.sim, r) {
		t.Fatalf("sync cursor after backfill at %v, want %v", got.Position, lastPosition(w.sim, r))
	}
	changed := w.sim.Mutate(25)
	want := 0
	for _, o := range changed {
		if o.Resource == r {
			want++
		}
	}
	st, err := w.engine.Sync(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if st.Objects != want {
		t.Errorf("sync after backfill read %d objects, want the %d changed since", st.Objects, want)
	}
	if st.Duration <= 0 || st.Requests != st.Pages {
		t.Errorf("sync stats: duration=%s requests=%d pages=%d, want a measured duration and one request per page", st.Duration, st.Requests, st.Pages)
	}
}

// --restart discards an unfinished checkpoint.
func TestBackfillRestart(t *testing.T) {
	w := newWorld(t, 100)
	ctx, cancel := context.WithCancel(context.Background())
	r := backstop.Chats
	w.engine.OnPage = func(st backstop.RunStats) {
		if st.Pages == 2 {
			cancel()
		}
	}
	if _, err := w.engine.Backfill(ctx, r, false); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	w.engine.OnPage = nil
	st, err := w.engine.Backfill(context.Background(), r, true)
	if err != nil {
		t.Fatal(err)
	}
	if st.Objects != 100 || st.New != 80 {
		t.Errorf("restarted backfill: objects=%d new=%d, want all 100 read and the 80 missing written", st.Objects, st.New)
	}
}

// Two syncs of one resource overlap (serve's job and a cron `backstop
// sync`): the one behind never moves the cursor back past the one that
// finished, so the next sync reads only later changes.
func TestOverlappingSyncsNeverMoveCursorBack(t *testing.T) {
	w := newWorld(t, 200)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := backstop.Contacts
	// B reads the feed with pages of 100 while A is at its first page of 10.
	ahead := &bsync.Engine{Source: w.engine.Source, Mirror: w.db, PageSize: 100}
	var bErr error
	w.engine.OnPage = func(st backstop.RunStats) {
		switch st.Pages {
		case 1:
			_, bErr = ahead.Sync(context.Background(), r)
		case 2:
			cancel() // A is killed after committing a page behind B
		}
	}
	st, err := w.engine.Sync(ctx, r)
	if bErr != nil {
		t.Fatal(bErr)
	}
	if !errors.Is(err, context.Canceled) || st.Pages != 2 {
		t.Fatalf("sync A: pages=%d err=%v, want 2 pages and context.Canceled", st.Pages, err)
	}
	end := lastPosition(w.sim, r)
	if got := w.cursor(t, r, backstop.CursorSync); got.Position != end {
		t.Fatalf("sync cursor at %v after the overlapping runs, want the end %v where B left it", got.Position, end)
	}
	w.engine.OnPage = nil
	st, err = w.engine.Sync(context.Background(), r)
	if err != nil || st.Objects != 0 {
		t.Errorf("next sync read %d objects (err %v), want none: nothing changed", st.Objects, err)
	}
}

// backfill --restart still starts over: it deletes its checkpoint, so a
// restarted run interrupted early leaves it early (not at the end the
// finished run left), and the sync cursor is not moved back.
func TestBackfillRestartMovesItsCheckpointBack(t *testing.T) {
	w := newWorld(t, 100)
	r := backstop.Messages
	if _, err := w.engine.Backfill(context.Background(), r, false); err != nil {
		t.Fatal(err)
	}
	end := lastPosition(w.sim, r)
	if c := w.cursor(t, r, backstop.CursorBackfill); !c.Done || c.Position != end {
		t.Fatalf("finished checkpoint %+v, want done at %v", c, end)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w.engine.OnPage = func(st backstop.RunStats) {
		if st.Pages == 2 {
			cancel()
		}
	}
	if _, err := w.engine.Backfill(ctx, r, true); !errors.Is(err, context.Canceled) {
		t.Fatalf("restarted backfill: %v, want context.Canceled", err)
	}
	w.engine.OnPage = nil
	c := w.cursor(t, r, backstop.CursorBackfill)
	if c.Done || c.Position != w.sim.Objects(r)[19].Position() {
		t.Errorf("checkpoint after 2 restarted pages of 10: %+v, want at object 20, not done", c)
	}
	if got := w.cursor(t, r, backstop.CursorSync); got.Position != end {
		t.Errorf("restarted backfill moved the sync cursor %v -> %v", end, got.Position)
	}
	// Resumed, it reads the 80 objects after its checkpoint.
	st, err := w.engine.Backfill(context.Background(), r, false)
	if err != nil || st.Objects != 80 {
		t.Errorf("resumed backfill: objects=%d err=%v, want 80", st.Objects, err)
	}
}

// `backstop cursors reset` still starts the sync over from the beginning.
func TestSyncAfterCursorsResetStartsOver(t *testing.T) {
	w := newWorld(t, 60)
	r := backstop.Payments
	if _, err := w.engine.Sync(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if err := w.db.ResetCursors(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w.engine.OnPage = func(st backstop.RunStats) {
		if st.Pages == 1 {
			cancel()
		}
	}
	if _, err := w.engine.Sync(ctx, r); !errors.Is(err, context.Canceled) {
		t.Fatalf("sync after reset: %v, want context.Canceled", err)
	}
	if c := w.cursor(t, r, backstop.CursorSync); c.Position != w.sim.Objects(r)[9].Position() {
		t.Errorf("sync cursor after reset and one page: %v, want at object 10", c.Position)
	}
}

// `backstop cursors reset` while a sync (or backfill) of that resource is
// running wins: the running run's next page is not committed over it, the
// run stops with ErrCursorReset, and the next run starts from the reset
// cursor (the beginning of the feed).
func TestCursorsResetWhileRunningWins(t *testing.T) {
	routes := []backstop.Route{{Target: "crm", Events: []string{"*"}}}
	runs := map[string]func(w *world, ctx context.Context, r backstop.Resource) (backstop.RunStats, error){
		"sync": func(w *world, ctx context.Context, r backstop.Resource) (backstop.RunStats, error) {
			return w.engine.Sync(ctx, r)
		},
		"sync-emit": func(w *world, ctx context.Context, r backstop.Resource) (backstop.RunStats, error) {
			st, _, err := w.engine.SyncEmit(ctx, r, routes)
			return st, err
		},
		"backfill": func(w *world, ctx context.Context, r backstop.Resource) (backstop.RunStats, error) {
			return w.engine.Backfill(ctx, r, false)
		},
		"backfill-emit": func(w *world, ctx context.Context, r backstop.Resource) (backstop.RunStats, error) {
			st, _, err := w.engine.BackfillEmit(ctx, r, false, routes)
			return st, err
		},
	}
	for name, run := range runs {
		t.Run(name, func(t *testing.T) {
			w := newWorld(t, 100)
			w.engine.EmitGuard = w.db
			ctx := context.Background()
			r := backstop.Contacts
			// The reset comes between the running run's third and fourth
			// page, from another connection to the store.
			other, err := store.Open(ctx, w.db.Path(), store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			w.engine.OnPage = func(st backstop.RunStats) {
				if st.Pages == 3 {
					if err := other.ResetCursors(ctx, r); err != nil {
						t.Error(err)
					}
				}
			}
			st, err := run(w, ctx, r)
			if !errors.Is(err, bsync.ErrCursorReset) || st.Pages != 3 {
				t.Fatalf("run across a reset: pages=%d err=%v, want 3 pages and ErrCursorReset", st.Pages, err)
			}
			curs, err := w.db.Cursors(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(curs) != 0 {
				t.Fatalf("cursors after the reset and the running run's next page: %+v, want none (the reset stands)", curs)
			}
			// The next run starts at the beginning and reads it all.
			w.engine.OnPage = nil
			st, err = run(w, ctx, r)
			if err != nil || st.Objects != 100 {
				t.Fatalf("run after the reset: objects=%d err=%v, want all 100 from the start", st.Objects, err)
			}
		})
	}
}
