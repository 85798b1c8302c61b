package main

import (
	"context"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	stdsync "sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// The main acceptance test: 4 resources × 5,000 objects against a
// fixed-window limit that makes the run span at least 10 windows.
func TestBackfillMirrorsPlatformWithinQuota(t *testing.T) {
	// 1,252 requests at 100 per 4 s window: at least 12 windows wherever the
	// run starts. The rate (400 objects/s) leaves room for a CI machine that
	// runs other packages' tests beside this one, all under -race: quota
	// unused because the CPU was busy is not the governor's doing.
	const limit = 100
	e := newEnv(t, envOpts{
		sim:       sim.Options{Seed: 7, Objects: 5000, Limit: limit, Window: 4 * time.Second},
		pageSize:  16,
		perMinute: 15 * limit, window: "4s",
	})
	code, stdout, stderr := e.run(context.Background(), "backfill", "--json")
	if code != 0 {
		t.Fatalf("backfill exit %d\n%s", code, stderr)
	}
	e.assertMirrorEqualsSim()

	sum := parseSummary(t, stdout)
	requests := 0
	for _, r := range sum.Resources {
		if r.Objects != 5000 || r.New != 5000 || r.Result != "ok" {
			t.Errorf("%s: objects=%d new=%d result=%s, want 5000 new", r.Resource, r.Objects, r.New, r.Result)
		}
		requests += r.Requests
	}
	st := e.sim.Stats()
	if st.RateLimited != 0 {
		t.Errorf("the platform answered %d × 429, want none", st.RateLimited)
	}
	if requests != st.Requests {
		t.Errorf("backfill counted %d requests, the platform %d", requests, st.Requests)
	}
	// Quota use over the full windows: every window but the first and the
	// last, which the run only partly covers.
	if len(st.Windows) < 12 {
		t.Fatalf("the run spanned %d windows, want at least 10 full ones", len(st.Windows))
	}
	full := st.Windows[1 : len(st.Windows)-1]
	used := 0
	for _, w := range full {
		used += w.Requests
	}
	share := float64(used) / float64(len(full)*limit)
	t.Logf("%d requests over %d windows; %.1f%% of the quota used over %d full windows", st.Requests, len(st.Windows), 100*share, len(full))
	if share < 0.90 {
		t.Errorf("used %.1f%% of the quota over the full windows, want at least 90%%", 100*share)
	}
}

// SIGKILL at random moments: every restart finds the cursor not ahead of the
// mirror, and the final mirror equals the platform.
func TestBackfillResumesAfterSIGKILL(t *testing.T) {
	e := newEnv(t, envOpts{
		sim:       sim.Options{Seed: 11, Objects: 1500, Limit: 200, Window: time.Second},
		pageSize:  20,
		perMinute: 12000, window: "1s",
	})
	seed := uint64(time.Now().UnixNano())
	t.Logf("kill points drawn with seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range 5 {
		cmd, lines := e.startBinary("--log-level", "debug", "backfill")
		pages := 1 + rng.IntN(40)
		waitLines(t, lines, "page committed", pages, time.Minute)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		err := cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("kill %d: process was not killed (%v); the backfill finished too early to test", i, err)
		}
		e.assertCursorNotAhead()
		t.Logf("kill %d after %d pages: cursor not ahead of the mirror", i+1, pages)
	}
	code, _, stderr := e.run(context.Background(), "backfill")
	if code != 0 {
		t.Fatalf("final backfill exit %d\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "resuming backfill") {
		t.Errorf("the last run did not resume from the checkpoint:\n%s", stderr)
	}
	e.assertMirrorEqualsSim()
	e.assertCursorNotAhead()
}

// Ctrl-C (SIGINT) finishes the page, saves the cursor and exits 130.
func TestSyncInterruptExits130(t *testing.T) {
	e := newEnv(t, envOpts{
		sim:       sim.Options{Seed: 3, Objects: 2000, Limit: 100, Window: time.Second},
		perMinute: 6000, window: "1s",
	})
	cmd, lines := e.startBinary("--log-level", "debug", "sync")
	waitLines(t, lines, "page committed", 10, time.Minute)
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	var tail []string
	for l := range lines {
		tail = append(tail, l)
	}
	cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Fatalf("exit %d after Ctrl-C, want 130\n%s", code, strings.Join(tail, "\n"))
	}
	e.assertCursorNotAhead()
	db := e.openStore()
	n := 0
	for _, r := range backstop.Resources {
		c, err := db.Count(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		n += c
	}
	db.Close()
	if n == 0 || n == 4*2000 {
		t.Errorf("objects in the mirror after Ctrl-C: %d, want some but not all", n)
	}
	// The next sync completes from the saved cursor.
	if code, _, stderr := e.run(context.Background(), "sync"); code != 0 {
		t.Fatalf("sync after interrupt: exit %d\n%s", code, stderr)
	}
	e.assertMirrorEqualsSim()
}

// Objects change during and after a sync; the next sync brings every change
// in, including across page boundaries inside runs of equal updated_at.
func TestSyncFollowsMutations(t *testing.T) {
	const pageSize = 7
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 5, Objects: 700, MutationRate: 200}, pageSize: pageSize})

	// The test is only meaningful if equal updated_at values straddle page
	// boundaries in the feed.
	objs := e.sim.Objects(backstop.Payments)
	straddles := 0
	for i := pageSize; i < len(objs); i += pageSize {
		if objs[i-1].UpdatedAt.Equal(objs[i].UpdatedAt) {
			straddles++
		}
	}
	if straddles == 0 {
		t.Fatal("no run of equal updated_at crosses a page boundary: the sim data does not exercise it")
	}

	// The sim's own mutation generator runs while the first sync does.
	ctx, cancel := context.WithCancel(context.Background())
	var wg stdsync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		e.sim.Run(ctx)
	}()
	code, _, stderr := e.run(context.Background(), "sync")
	cancel()
	wg.Wait()
	if code != 0 {
		t.Fatalf("first sync exit %d\n%s", code, stderr)
	}
	changed := e.sim.Mutate(150) // and after it
	if len(changed) != 150 {
		t.Fatalf("Mutate made %d changes", len(changed))
	}
	code, stdout, stderr := e.run(context.Background(), "sync", "--json")
	if code != 0 {
		t.Fatalf("second sync exit %d\n%s", code, stderr)
	}
	e.assertMirrorEqualsSim()
	sum := parseSummary(t, stdout)
	seen := 0
	for _, r := range sum.Resources {
		seen += r.New + r.Updated
	}
	if seen < 150 {
		t.Errorf("second sync wrote %d new or updated objects, want at least the 150 changed after the first", seen)
	}
	// A third sync has nothing to do.
	code, stdout, _ = e.run(context.Background(), "sync", "--json")
	if code != 0 {
		t.Fatal("third sync failed")
	}
	for _, r := range parseSummary(t, stdout).Resources {
		if r.New+r.Updated != 0 {
			t.Errorf("%s: idle sync wrote %d objects", r.Resource, r.New+r.Updated)
		}
	}
}

// Three syncs of different resources at once in one process share one key's
// governor: zero 429s even though the limit is tight.
func TestConcurrentSyncsShareOneKey(t *testing.T) {
	const limit = 30
	e := newEnv(t, envOpts{
		sim:       sim.Options{Seed: 9, Objects: 600, Limit: limit, Window: time.Second, RetryAfter: "mixed"},
		perMinute: 60 * limit, window: "1s",
	})
	code, stdout, stderr := e.run(context.Background(), "sync", "contacts", "chats", "messages", "--json")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	if n := e.sim.Stats().RateLimited; n != 0 {
		t.Errorf("the platform answered %d × 429, want none", n)
	}
	if len(e.sim.Stats().Windows) < 3 {
		t.Errorf("run spanned %d windows; the limit did not bind", len(e.sim.Stats().Windows))
	}
	for _, r := range parseSummary(t, stdout).Resources {
		if r.RateLimited != 0 {
			t.Errorf("%s: %d × 429", r.Resource, r.RateLimited)
		}
	}
	e.assertMirrorEqualsSim(backstop.Contacts, backstop.Chats, backstop.Messages)
}

func TestUnauthorizedStopsAtOnce(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 50}})
	code, _, stderr := e.runKey(context.Background(), "wrong-key-1234", "sync", "payments")
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "payments") || !strings.Contains(stderr, "unauthorized") {
		t.Errorf("error does not name the resource and the cause:\n%s", stderr)
	}
	if strings.Contains(stderr, "wrong-key-1234") {
		t.Errorf("the API key leaked into the output:\n%s", stderr)
	}
	if st := e.sim.Stats(); st.Unauthorized != 1 {
		t.Errorf("%d requests refused with 401, want exactly 1 (no retries)", st.Unauthorized)
	}
}

func TestInvalidCursorStopsWithoutReset(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 2, Objects: 100}})
	if code, _, stderr := e.run(context.Background(), "sync", "chats"); code != 0 {
		t.Fatalf("first sync exit %d\n%s", code, stderr)
	}
	db := e.openStore()
	before, _, err := db.Cursor(context.Background(), backstop.Chats, backstop.CursorSync)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	e.sim.InvalidateCursors()
	e.sim.Mutate(20)
	code, _, stderr := e.run(context.Background(), "sync", "chats")
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "chats") || !strings.Contains(stderr, "invalid cursor") || !strings.Contains(stderr, before.Value) {
		t.Errorf("error does not name the resource, the cause and the cursor %q:\n%s", before.Value, stderr)
	}
	if !strings.Contains(stderr, "run `backstop --config "+e.config+" cursors reset chats` to start its feed over") {
		t.Errorf("error does not say how to start over:\n%s", stderr)
	}
	db = e.openStore()
	after, _, err := db.Cursor(context.Background(), backstop.Chats, backstop.CursorSync)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if after.Value != before.Value {
		t.Errorf("cursor changed from %q to %q after invalid_cursor", before.Value, after.Value)
	}
}

// A 5xx storm longer than the retry budget, starting mid-run: a clear error,
// exit 1, and mirror and cursor as of the last committed page.
func TestServerErrorStormKeepsLastCommittedPage(t *testing.T) {
	const okRequests = 6
	var served atomic.Int64
	storm := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if served.Add(1) > okRequests {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadGateway)
				w.Write([]byte(`{"error":{"code":"bad_gateway","message":"upstream is down"}}`))
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 4, Objects: 500}, pageSize: 25, retryMax: 2, wrap: storm})
	code, stdout, stderr := e.run(context.Background(), "sync", "messages", "--json")
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "messages") || !strings.Contains(stderr, "502") {
		t.Errorf("error does not name the resource and the status:\n%s", stderr)
	}
	sum := parseSummary(t, stdout)
	if got := sum.Resources[0]; got.Pages != okRequests || got.Result != "failed" || got.Requests != okRequests+3 {
		t.Errorf("pages=%d requests=%d result=%s, want %d pages, %d requests (1 + 2 retries for the failing page), failed",
			got.Pages, got.Requests, got.Result, okRequests, okRequests+3)
	}
	e.assertCursorNotAhead()
	db := e.openStore()
	defer db.Close()
	n, err := db.Count(context.Background(), backstop.Messages)
	if err != nil {
		t.Fatal(err)
	}
	if n != okRequests*25 {
		t.Errorf("mirror holds %d messages, want the %d of the committed pages", n, okRequests*25)
	}
}

// TestHandSyncEmitsLikeTheJob: sync run by hand shares the sync job's
// cursor, so it emits what it reads as the job would: every change reaches
// the targets' outbox once, whichever of the two read it, and a backfill
// emits only with --emit.
func TestHandSyncEmitsLikeTheJob(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 4, Objects: 40}})
	data, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	e.writeConfig(string(data) + `targets:
  - {name: billing, url: "https://billing.example.com/hooks", events: ["payment.*"]}
jobs:
  - {name: payments-sync, kind: sync, resources: [payments], every: 1h}
`)
	outbox := func() map[string]bool {
		t.Helper()
		db, err := store.Open(context.Background(), e.db, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		rows, err := db.OutboxRows(context.Background(), "billing")
		if err != nil {
			t.Fatal(err)
		}
		ids := map[string]bool{}
		for _, r := range rows {
			if ids[r.EventID] {
				t.Errorf("event %s queued twice", r.EventID)
			}
			ids[r.EventID] = true
		}
		return ids
	}
	emitted := func(stdout string) int {
		t.Helper()
		n := 0
		for _, r := range parseSummary(t, stdout).Resources {
			if r.Emitted == nil {
				t.Fatalf("%s: the summary of an emitting run has no emitted count:\n%s", r.Resource, stdout)
			}
			n += *r.Emitted
		}
		return n
	}

	// A backfill without --emit fills the mirror and, the platform's
	// objects being older than the run, queues nothing.
	code, stdout, stderr := e.run(context.Background(), "backfill", "payments", "--json")
	if code != 0 {
		t.Fatalf("backfill exit %d\n%s", code, stderr)
	}
	if r := parseSummary(t, stdout).Resources[0]; r.Objects != 40 || r.Emitted == nil || *r.Emitted != 0 {
		t.Fatalf("backfill summary %+v, want 40 objects and 0 emitted", r)
	}
	if n := len(outbox()); n != 0 {
		t.Fatalf("backfill without --emit queued %d deliveries", n)
	}
	// Run again, the finished backfill reads nothing, and says so.
	code, stdout, stderr = e.run(context.Background(), "backfill", "payments", "--json")
	if r := parseSummary(t, stdout).Resources[0]; code != 0 || r.Result != "already_done" || r.Pages != 0 {
		t.Fatalf("second backfill: exit %d, summary %+v, want already done\n%s", code, r, stderr)
	}

	// Changes read by the job, then by a hand-run sync, then by the job
	// again: each reaches the outbox once.
	changes := 0
	for i, args := range [][]string{{"run", "payments-sync", "--json"}, {"sync", "payments", "--json"}, {"run", "payments-sync", "--json"}} {
		ids := map[string]bool{} // an object changed twice is read once, at its latest
		for _, o := range e.sim.Mutate(60) {
			if o.Resource == backstop.Payments {
				ids[o.ID] = true
			}
		}
		changed := len(ids)
		changes += changed
		code, stdout, stderr := e.run(context.Background(), args...)
		if code != 0 {
			t.Fatalf("%v exit %d\n%s", args, code, stderr)
		}
		if args[0] == "sync" {
			if n := emitted(stdout); n != changed {
				t.Errorf("step %d, hand sync: emitted %d, want the %d payments changed", i+1, n, changed)
			}
		}
		if n := len(outbox()); n != changes {
			t.Errorf("after step %d (%v): %d deliveries queued, want %d (every payment change once)", i+1, args, n, changes)
		}
	}
	if changes == 0 {
		t.Fatal("the sim changed no payment")
	}

	// backfill --emit (from the start again) finds nothing newer than the
	// mirror: it emits nothing, and says so.
	code, stdout, stderr = e.run(context.Background(), "backfill", "payments", "--restart", "--emit", "--json")
	if code != 0 {
		t.Fatalf("backfill --emit exit %d\n%s", code, stderr)
	}
	if n := emitted(stdout); n != 0 {
		t.Errorf("backfill --emit over an up-to-date mirror emitted %d", n)
	}
}
