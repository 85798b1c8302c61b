package sync_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	bsync "github.com/backstop-sync/backstop/sync"
)

// A backfill that does not emit is allowed only where it cannot swallow
// changes a target subscribes to: no subscriber, nothing left to read, or
// the resource's first fill.
func TestCheckBackfillRefusesWhereEventsWouldBeLost(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, 60)
	r := backstop.Contacts
	crm := []backstop.Route{{Target: "crm", Events: []string{"contact.*"}}}
	billing := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	check := func(step string, restart bool, routes []backstop.Route, refused bool) {
		t.Helper()
		err := w.engine.CheckBackfill(ctx, r, restart, routes)
		if got := errors.Is(err, bsync.ErrSilentBackfill); got != refused || (err != nil && !got) {
			t.Fatalf("%s: CheckBackfill = %v, want refused=%v", step, err, refused)
		}
		if refused && (!strings.Contains(err.Error(), "crm") || !strings.Contains(err.Error(), "contact.updated")) {
			t.Errorf("%s: the refusal does not name the target and its events: %v", step, err)
		}
	}

	// First fill, resumed, finished.
	check("fresh store", false, crm, false)
	interruptBackfill(t, w, r, nil)
	check("an unfinished first fill", false, crm, false)
	check("an unfinished first fill, restarted", true, crm, false)
	if _, err := w.engine.Backfill(ctx, r, false); err != nil {
		t.Fatal(err)
	}
	// The finished backfill handed its position to the sync cursor.
	check("a finished backfill (reads nothing)", false, crm, false)
	check("a finished backfill, restarted", true, crm, true)
	check("no target subscribes", true, billing, false)
	check("no target", true, nil, false)

	// Syncing, the platform changes: a plain backfill would swallow them.
	w.sim.Mutate(30)
	if err := w.db.ResetCursor(ctx, r, backstop.CursorBackfill); err != nil {
		t.Fatal(err)
	}
	check("syncing, no checkpoint", false, crm, true)
	// After `cursors reset` the mirror still holds what was emitted.
	if err := w.db.ResetCursors(ctx, r); err != nil {
		t.Fatal(err)
	}
	check("after cursors reset", false, crm, true)
}

// A scheduled backfill without emit on a resource that is already syncing
// fails its run, with the reason, before reading anything; with emit it
// runs and emits the changes.
func TestScheduledSilentBackfillFailsInsteadOfLosingEvents(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, 40)
	r := backstop.Contacts
	routes := []backstop.Route{{Target: "crm", Events: []string{"contact.*"}}}
	if _, _, err := w.engine.SyncEmit(ctx, r, routes); err != nil {
		t.Fatal(err)
	}
	w.sim.Mutate(40)
	s, err := bsync.NewScheduler([]bsync.Job{
		{Name: "refill", Kind: bsync.JobBackfill, Resources: []backstop.Resource{r}, Every: time.Hour},
		{Name: "refill-emit", Kind: bsync.JobBackfill, Resources: []backstop.Resource{r}, Every: time.Hour, Emit: true},
	}, bsync.SchedulerOptions{Engine: w.engine, Store: jobStore{w.db}, Routes: routes})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	before, err := w.db.Objects(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	run, err := s.RunJob(ctx, "refill")
	if !errors.Is(err, bsync.ErrSilentBackfill) || run.Status != bsync.JobFailed || run.Counts.Pages != 0 {
		t.Fatalf("silent backfill job: status %s, %d pages, err %v; want failed before reading, with ErrSilentBackfill", run.Status, run.Counts.Pages, err)
	}
	if !strings.Contains(err.Error(), "emit: true") {
		t.Errorf("the failure does not say how to fix it: %v", err)
	}
	stored, err := w.db.JobRuns(ctx, "refill", 1)
	if err != nil || len(stored) != 1 || stored[0].Status != "failed" || !strings.Contains(stored[0].Error, "would lose events") {
		t.Errorf("stored run %+v, %v; want failed with the reason", stored, err)
	}
	after, err := w.db.Objects(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Fatalf("the refused job wrote to the mirror: %d objects, were %d", len(after), len(before))
	}
	for i := range after {
		if !after[i].UpdatedAt.Equal(before[i].UpdatedAt) {
			t.Fatalf("the refused job wrote %s to the mirror", after[i].ID)
		}
	}
	run, err = s.RunJob(ctx, "refill-emit")
	if err != nil || run.Status != bsync.JobOK || run.Counts.Reemitted == 0 {
		t.Fatalf("emitting backfill job: %+v, %v; want ok with the changes emitted", run, err)
	}
}

// A first fill started with --emit and interrupted used to resume without
// --emit unrefused (an unfinished checkpoint counted as a first fill): the
// targets got the events of what it read before the interruption and none
// after. Resuming or restarting it without emitting is now refused; with
// --emit it resumes and every object has its event once.
func TestResumingAnEmittingBackfillWithoutEmitIsRefused(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, 60)
	r := backstop.Contacts
	crm := []backstop.Route{{Target: "crm", Events: []string{"contact.*"}}}
	interruptBackfill(t, w, r, crm)
	err := w.engine.CheckBackfill(ctx, r, false, crm)
	if !errors.Is(err, bsync.ErrSilentBackfill) || !strings.Contains(err.Error(), "was run with --emit") {
		t.Fatalf("resuming an emitting backfill without emit: CheckBackfill = %v, want refused saying it was run with --emit", err)
	}
	// Restarted, it would read again what was emitted (unchanged, no
	// event) and write the rest without events all the same.
	if err := w.engine.CheckBackfill(ctx, r, true, crm); !errors.Is(err, bsync.ErrSilentBackfill) {
		t.Errorf("restarting it without emit: CheckBackfill = %v, want refused", err)
	}
	_, em, err := w.engine.BackfillEmit(ctx, r, false, crm)
	if err != nil || em.Emitted != 40 {
		t.Fatalf("resumed with emit: emitted %d, err %v; want the other 40", em.Emitted, err)
	}
}

// A sync that emits is refused, before reading anything, while the
// resource's first fill (a backfill without emitting, so that the targets
// do not get the platform's history) is unfinished: from no sync cursor it
// would emit every object the backfill has not reached yet as new. Once
// the backfill finishes, the sync continues from its end.
func TestSyncRefusedWhileASilentFirstFillIsUnfinished(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, 60)
	r := backstop.Contacts
	crm := []backstop.Route{{Target: "crm", Events: []string{"contact.*"}}}
	billing := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	interruptBackfill(t, w, r, nil)

	st, em, err := w.engine.SyncEmit(ctx, r, crm)
	if !errors.Is(err, bsync.ErrFirstFillUnfinished) || !strings.Contains(err.Error(), "backstop backfill contacts") || !strings.Contains(err.Error(), "crm") {
		t.Fatalf("sync during an unfinished silent first fill: %v, want refused naming the target and the command that finishes it", err)
	}
	if st.Pages != 0 || em.Emitted != 0 {
		t.Errorf("the refused sync read %d pages and emitted %d events, want none", st.Pages, em.Emitted)
	}
	if _, saved, err := w.db.Cursor(ctx, r, backstop.CursorSync); err != nil || saved {
		t.Errorf("the refused sync saved a sync cursor (%v)", err)
	}
	// No target gets contacts' events: nothing to flood, the sync runs.
	if _, _, err := w.engine.SyncEmit(ctx, r, billing); err != nil {
		t.Errorf("sync with no subscriber: %v", err)
	}
	if err := w.db.ResetCursor(ctx, r, backstop.CursorSync); err != nil {
		t.Fatal(err)
	}

	if _, err := w.engine.Backfill(ctx, r, false); err != nil {
		t.Fatal(err)
	}
	if _, em, err := w.engine.SyncEmit(ctx, r, crm); err != nil || em.Emitted != 0 {
		t.Fatalf("sync after the first fill finished: emitted %d, err %v; want it to continue from the backfill's end", em.Emitted, err)
	}
}

// Next to an unfinished backfill that emits, a sync only emits sooner
// what the backfill would have: it is not refused.
func TestSyncRunsBesideAnUnfinishedEmittingBackfill(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, 60)
	r := backstop.Contacts
	crm := []backstop.Route{{Target: "crm", Events: []string{"contact.*"}}}
	interruptBackfill(t, w, r, crm)
	if _, em, err := w.engine.SyncEmit(ctx, r, crm); err != nil || em.Emitted != 40 {
		t.Fatalf("sync beside an emitting backfill: emitted %d, err %v; want the 40 it had not read", em.Emitted, err)
	}
}

// interruptBackfill runs a first backfill of r, emitting to routes (none:
// without emitting), and cancels it after its second page.
func interruptBackfill(t *testing.T, w *world, r backstop.Resource, routes []backstop.Route) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w.engine.OnPage = func(st backstop.RunStats) {
		if st.Pages == 2 {
			cancel()
		}
	}
	defer func() { w.engine.OnPage = nil }()
	var err error
	if routes == nil {
		_, err = w.engine.Backfill(ctx, r, false)
	} else {
		_, _, err = w.engine.BackfillEmit(ctx, r, false, routes)
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted backfill of %s: %v, want cancelled", r, err)
	}
}
