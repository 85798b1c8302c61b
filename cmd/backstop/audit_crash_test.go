package main

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	stdsync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources/sim"
)

// The crash-consistency promise, checked by killing the real binary with
// SIGKILL at moments drawn from a seed (BACKSTOP_CRASH_SEED replays a
// failure): whatever the moment, a restart completes the work, nothing
// acknowledged is lost, no cursor is ahead of the mirror or of the events,
// every queued delivery reaches the target at least once (a repeat with the
// same X-Event-Id), no version reaches it as two different events, and the
// mirror ends equal to the platform.

// crashSeed is the seed of a test's kill points, logged so that a failure
// reproduces with BACKSTOP_CRASH_SEED.
func crashSeed(t *testing.T) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("BACKSTOP_CRASH_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("BACKSTOP_CRASH_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("kill points drawn with seed %d (BACKSTOP_CRASH_SEED=%d replays them)", seed, seed)
	return rand.New(rand.NewPCG(seed, 7))
}

// crashTarget is a delivery target that logs every request it gets and
// fails some first attempts (500, or 429 with Retry-After: 1), chosen from
// the event id so that no delivery runs out of retries.
type crashTarget struct {
	t  *testing.T
	mu stdsync.Mutex
	// hits counts requests; ok counts those answered 2xx; limited those
	// answered 429 (each pauses the target's queue for a second, so they
	// are few).
	hits, ok, limited int
	// okIDs holds the X-Event-Id of every request answered 2xx.
	okIDs map[string]int
	// keyIDs maps each version's dedup key to the X-Event-Ids it came with.
	keyIDs map[string]map[string]bool
	// bad lists requests whose envelope disagreed with their headers.
	bad []string
}

func newCrashTarget(t *testing.T) *crashTarget {
	return &crashTarget{t: t, okIDs: map[string]int{}, keyIDs: map[string]map[string]bool{}}
}

func (c *crashTarget) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	id := r.Header.Get("X-Event-Id")
	var env struct {
		EventID   string `json:"event_id"`
		Event     string `json:"event"`
		Truncated bool   `json:"truncated"`
		Data      struct {
			ID        string `json:"id"`
			UpdatedAt string `json:"updated_at"`
		} `json:"data"`
	}
	key, problem := "", ""
	if err := json.Unmarshal(body, &env); err == nil && env.Truncated {
		// Over the target's max_payload, data is only the id: the
		// version is not known here.
	} else if err != nil {
		problem = fmt.Sprintf("%s: body is not an envelope: %v", id, err)
	} else if env.EventID != id || r.Header.Get("webhook-id") != id {
		problem = fmt.Sprintf("X-Event-Id %s, webhook-id %s, envelope event_id %s", id, r.Header.Get("webhook-id"), env.EventID)
	} else if res, ok := backstop.ResourceOfEventType(env.Event); !ok {
		problem = fmt.Sprintf("%s: unknown event type %q", id, env.Event)
	} else if at, err := backstop.ParseTime(env.Data.UpdatedAt); err != nil {
		problem = fmt.Sprintf("%s: updated_at %q: %v", id, env.Data.UpdatedAt, err)
	} else {
		key = backstop.DedupKey(res, env.Data.ID, at)
	}
	h := fnv.New32a()
	h.Write([]byte(id))
	status := http.StatusOK
	c.mu.Lock()
	if r.Header.Get("X-Delivery-Attempt") == "1" {
		switch h.Sum32() % 13 {
		case 0, 1:
			status = http.StatusInternalServerError
		case 2:
			if c.limited < 4 {
				c.limited++
				status = http.StatusTooManyRequests
				w.Header().Set("Retry-After", "1")
			}
		}
	}
	c.hits++
	if problem != "" {
		c.bad = append(c.bad, problem)
	}
	if key != "" {
		if c.keyIDs[key] == nil {
			c.keyIDs[key] = map[string]bool{}
		}
		c.keyIDs[key][id] = true
	}
	if status == http.StatusOK {
		c.ok++
		c.okIDs[id]++
	}
	c.mu.Unlock()
	w.WriteHeader(status)
}

func (c *crashTarget) count() (hits, ok int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits, c.ok
}

// check asserts the target's side of the promise: every envelope matched
// its headers, and no version arrived as two different events.
func (c *crashTarget) check() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, b := range c.bad {
		if i < 5 {
			c.t.Errorf("target got a bad request: %s", b)
		}
	}
	twice := 0
	for key, ids := range c.keyIDs {
		if len(ids) > 1 {
			twice++
			if twice <= 5 {
				c.t.Errorf("version %s reached the target as %d different events: %v", key, len(ids), ids)
			}
		}
	}
	if twice > 0 {
		c.t.Errorf("%d versions reached the target as more than one event", twice)
	}
}

// delivered reports whether a request with X-Event-Id id was answered 2xx,
// and whether version key reached the target at all.
func (c *crashTarget) delivered(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.okIDs[id] > 0
}

func (c *crashTarget) deliveredKey(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.keyIDs[key] {
		if c.okIDs[id] > 0 {
			return true
		}
	}
	return false
}

// crashTargetConfig is the targets section for a crashTarget at url that
// subscribes to events.
func crashTargetConfig(url string, events ...string) string {
	return fmt.Sprintf(`targets:
  - name: audit
    url: %s
    secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
    events: [%s]
    allow_private: true
    connect_timeout: 1s
    timeout: 1s
    retry_schedule: [100ms, 200ms, 400ms, 800ms]
`, url, `"`+strings.Join(events, `", "`)+`"`)
}

// runUntilKilled starts the binary with args and, once n stderr lines
// containing substr have gone by, kills it with SIGKILL. It reports
// whether the kill happened (false: the process ended first, on its own,
// with exit code 0; any other end fails the test).
func (e *env) runUntilKilled(env []string, substr string, n int, args ...string) bool {
	e.t.Helper()
	cmd, lines := e.startBinaryWith(env, args...)
	seen := 0
	var tail []string
	timeout := time.After(2 * time.Minute)
	for seen < n {
		select {
		case l, ok := <-lines:
			if !ok {
				cmd.Wait()
				if code := cmd.ProcessState.ExitCode(); code != 0 {
					e.t.Fatalf("%v exit %d before the kill point\n%s", args, code, strings.Join(tail, "\n"))
				}
				return false
			}
			if len(tail) < 40 {
				tail = append(tail, l)
			}
			if strings.Contains(l, substr) {
				seen++
			}
		case <-timeout:
			e.t.Fatalf("%v: saw %d of %d %q lines in 2m", args, seen, n, substr)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		e.t.Fatal(err)
	}
	cmd.Wait()
	go func() {
		for range lines {
		}
	}()
	return true
}

// runToEnd runs the binary with args and fails the test unless it exits 0.
func (e *env) runToEnd(env []string, args ...string) string {
	e.t.Helper()
	return e.runExit(env, 0, args...)
}

// runExit runs the binary with args and fails the test unless it exits
// with code; it returns its stderr.
func (e *env) runExit(env []string, want int, args ...string) string {
	e.t.Helper()
	cmd, lines := e.startBinaryWith(env, args...)
	var all []string
	for l := range lines {
		all = append(all, l)
	}
	cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != want {
		e.t.Fatalf("%v exit %d, want %d\n%s", args, code, want, strings.Join(all, "\n"))
	}
	return strings.Join(all, "\n")
}

// assertEventsNotBehind checks, in the store as a crash left it, that every
// mirrored version of resources has its event (the engine's id for the
// version) and that event its delivery row for target audit: no mirror
// write committed without its event and its queue row.
func (e *env) assertEventsNotBehind(when string, resources ...backstop.Resource) {
	e.t.Helper()
	db := e.openStore()
	defer db.Close()
	ctx := context.Background()
	rows, err := db.OutboxRows(ctx, "audit")
	if err != nil {
		e.t.Fatal(err)
	}
	queued := make(map[string]bool, len(rows))
	for _, r := range rows {
		queued[r.EventID] = true
	}
	bad := 0
	for _, r := range resources {
		objs, err := db.Objects(ctx, r)
		if err != nil {
			e.t.Fatal(err)
		}
		for _, o := range objs {
			id := backstop.EventID(backstop.DedupKey(r, o.ID, o.UpdatedAt))
			_, stored, err := db.ProcessedEvent(ctx, id)
			if err != nil {
				e.t.Fatal(err)
			}
			if !stored || !queued[id] {
				bad++
				if bad <= 5 {
					e.t.Errorf("%s: %s %s is mirrored at %s, but its event %s is stored %v, queued %v",
						when, r, o.ID, backstop.CanonicalTime(o.UpdatedAt), id, stored, queued[id])
				}
			}
		}
	}
	if bad > 0 {
		e.t.Fatalf("%s: %d mirrored versions without their event or delivery", when, bad)
	}
}

// crashPoint is a moment to SIGKILL a process at: once count has grown
// by n since the process started.
type crashPoint struct {
	what  string
	n     int
	count func() int
	// term sends SIGTERM first and the SIGKILL once serve says it is
	// shutting down: a crash in the middle of its drain.
	term bool
}

// targetHits is a crashPoint after n requests at tgt.
func targetHits(tgt *crashTarget, n int) crashPoint {
	return crashPoint{what: "target requests", n: n, count: func() int { h, _ := tgt.count(); return h }}
}

// serveThroughKills runs serve, SIGKILLs it at each of kills, and runs a
// last one until every delivery row for audit is delivered; then it stops
// it with SIGTERM. It checks that each row was answered 2xx at the target
// under its own id.
func (e *env) serveThroughKills(env []string, tgt *crashTarget, kills []crashPoint, during func(round int)) {
	e.t.Helper()
	for i, k := range kills {
		first, lines := e.startBinaryEnv(env, "serve")
		waitLines(e.t, lines, "serving", 1, 30*time.Second)
		draining := make(chan struct{})
		go func() {
			seen := false
			for l := range lines {
				if !seen && strings.Contains(l, "shutting down") {
					seen = true
					close(draining)
				}
			}
			if !seen {
				close(draining)
			}
		}()
		base := k.count()
		if during != nil {
			during(i)
		}
		waitFor(e.t, 2*time.Minute, func() bool { return k.count() >= base+k.n })
		if k.term {
			if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				e.t.Fatal(err)
			}
			select {
			case <-draining:
			case <-time.After(30 * time.Second):
				e.t.Fatal("serve did not start shutting down within 30s of SIGTERM")
			}
		}
		if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			e.t.Fatal(err)
		}
		first.cmd.Wait()
		h, ok := tgt.count()
		e.t.Logf("serve %d killed (draining: %v) after %d %s (target: %d requests, %d answered 2xx)", i+1, k.term, k.n, k.what, h, ok)
	}
	last, lines := e.startBinaryEnv(env, "serve")
	waitLines(e.t, lines, "serving", 1, 30*time.Second)
	go func() {
		for range lines {
		}
	}()
	if during != nil {
		during(len(kills))
	}
	db := e.openStore()
	defer db.Close()
	ctx := context.Background()
	// Rows the killed processes held are sent again once their lease
	// (12 s with this target's timeouts) ends.
	var pending []string
	waitFor(e.t, 2*time.Minute, func() bool {
		rows, err := db.OutboxRows(ctx, "audit")
		if err != nil {
			e.t.Fatal(err)
		}
		pending = pending[:0]
		for _, r := range rows {
			if r.Status != "delivered" {
				pending = append(pending, r.EventID+" "+r.Status)
			}
		}
		return len(pending) == 0
	})
	if err := last.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		e.t.Fatal(err)
	}
	last.cmd.Wait()
	rows, err := db.OutboxRows(ctx, "audit")
	if err != nil {
		e.t.Fatal(err)
	}
	lost, twice, byKey := 0, 0, map[string]string{}
	for _, r := range rows {
		// One version is queued for a target as one event.
		var env struct {
			Event string `json:"event"`
			Data  struct {
				ID        string `json:"id"`
				UpdatedAt string `json:"updated_at"`
			} `json:"data"`
		}
		if err := json.Unmarshal(r.Payload, &env); err != nil {
			e.t.Errorf("delivery %d: payload: %v", r.ID, err)
		} else if res, ok := backstop.ResourceOfEventType(env.Event); ok && env.Data.UpdatedAt != "" {
			if at, err := backstop.ParseTime(env.Data.UpdatedAt); err == nil {
				key := backstop.DedupKey(res, env.Data.ID, at)
				if prev, seen := byKey[key]; seen && prev != r.EventID {
					twice++
					if twice <= 5 {
						e.t.Errorf("version %s is queued for audit as two events, %s and %s", key, prev, r.EventID)
					}
				}
				byKey[key] = r.EventID
			}
		}
		if !tgt.delivered(r.EventID) {
			lost++
			if lost <= 5 {
				e.t.Errorf("delivery %d (%s) is %s in the store but never got a 2xx at the target", r.ID, r.EventID, r.Status)
			}
		}
	}
	if lost > 0 {
		e.t.Errorf("%d of %d deliveries never reached the target", lost, len(rows))
	}
	h, ok := tgt.count()
	e.t.Logf("%d deliveries, %d target requests, %d answered 2xx", len(rows), h, ok)
}

// backfill --emit, sync and reconcile, each SIGKILLed at pages drawn from
// the seed and run again, then serve SIGKILLed while it delivers their
// events: after each kill the cursors are not ahead of the mirror and
// every mirrored version has its event and delivery; in the end the
// mirror equals the platform and every version reached the target once as
// one event.
func TestAuditCrashEmittersAndDelivery(t *testing.T) {
	t.Parallel()
	rng := crashSeed(t)
	tgt := newCrashTarget(t)
	target := httptest.NewServer(tgt)
	defer target.Close()
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 41, Objects: 400, BigObjects: -1}})
	e.writeServeConfig(addr, crashTargetConfig(target.URL, "payment.*", "contact.*"))
	// writeServeConfig keeps the default page size; a small one makes many
	// pages to kill between.
	base, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	e.writeConfig(strings.Replace(string(base), "  api_key: ${BOTIX_API_KEY}\n",
		"  api_key: ${BOTIX_API_KEY}\n  page_size: 20\n", 1))
	env := append(e.environ(e.sim.APIKey()), "BOTIX_WEBHOOK_SECRET="+webhookSecret)
	subscribed := []backstop.Resource{backstop.Payments, backstop.Contacts}
	res := []string{"payments", "contacts"}

	// backfill --emit: 2 × 20 pages; three kills within the first 24 (the
	// kills land a little after their line is read, so the three stay well
	// clear of the 40th page, which ends the backfill).
	for i := range 3 {
		n := 1 + rng.IntN(8)
		if !e.runUntilKilled(env, "page committed", n, append([]string{"--log-level", "debug", "backfill", "--emit"}, res...)...) {
			t.Fatalf("backfill kill %d: the backfill finished before %d pages", i+1, n)
		}
		e.assertCursorNotAhead()
		e.assertEventsNotBehind(fmt.Sprintf("backfill killed after %d pages", n), subscribed...)
		if i == 0 {
			// Resumed without --emit, the rest would never reach the
			// targets: refused, with nothing written.
			db := e.openStore()
			before, err := db.Count(context.Background(), backstop.Payments)
			db.Close()
			if err != nil {
				t.Fatal(err)
			}
			if out := e.runExit(env, 2, append([]string{"backfill"}, res...)...); !strings.Contains(out, "--emit") {
				t.Errorf("the refusal to resume without --emit does not name --emit:\n%s", out)
			}
			db = e.openStore()
			after, err := db.Count(context.Background(), backstop.Payments)
			db.Close()
			if err != nil {
				t.Fatal(err)
			}
			if after != before {
				t.Errorf("the refused backfill wrote %d payments", after-before)
			}
		}
	}
	if out := e.runToEnd(env, append([]string{"backfill", "--emit"}, res...)...); !strings.Contains(out, "resuming backfill") {
		t.Errorf("the last backfill did not resume from its checkpoint:\n%s", out)
	}
	e.assertMirrorEqualsSim(subscribed...)
	e.assertEventsNotBehind("backfill done", subscribed...)

	// sync of the changes: about 4 × 150 mutations, two kills.
	e.sim.Mutate(600)
	for i := range 2 {
		n := 1 + rng.IntN(4)
		if !e.runUntilKilled(env, "page committed", n, append([]string{"--log-level", "debug", "sync"}, res...)...) {
			t.Logf("sync kill %d: the sync finished before %d pages", i+1, n)
		}
		e.assertCursorNotAhead()
		e.assertEventsNotBehind(fmt.Sprintf("sync killed after %d pages", n), subscribed...)
	}
	e.runToEnd(env, append([]string{"sync"}, res...)...)
	e.assertMirrorEqualsSim(subscribed...)

	// reconcile of changes no sync has read: two kills within 40 pages.
	e.sim.Mutate(600)
	for i := range 2 {
		n := 1 + rng.IntN(15)
		if !e.runUntilKilled(env, "page reconciled", n, append([]string{"--log-level", "debug", "reconcile", "--full"}, res...)...) {
			t.Fatalf("reconcile kill %d: the reconcile finished before %d pages", i+1, n)
		}
		e.assertEventsNotBehind(fmt.Sprintf("reconcile killed after %d pages", n), subscribed...)
	}
	e.runToEnd(env, append([]string{"reconcile", "--full"}, res...)...)
	e.assertMirrorEqualsSim(subscribed...)
	e.assertEventsNotBehind("reconcile done", subscribed...)
	// The cursor sync left is behind the reconciled versions; a last sync
	// reads them again and emits nothing new.
	e.runToEnd(env, append([]string{"sync"}, res...)...)
	e.assertCursorNotAhead()

	// serve delivers it all, killed twice on the way.
	draining := targetHits(tgt, 50+rng.IntN(400))
	draining.term = true
	kills := []crashPoint{targetHits(tgt, 50+rng.IntN(400)), draining}
	// Meanwhile, with each serve up, more changes come and a sync (a cron
	// backstop sync beside serve) is SIGKILLed after its first page; the
	// last one finishes.
	e.serveThroughKills(env, tgt, kills, func(round int) {
		e.sim.Mutate(100)
		if round < len(kills) {
			e.runUntilKilled(env, "page committed", 1, append([]string{"--log-level", "debug", "sync"}, res...)...)
			e.assertEventsNotBehind(fmt.Sprintf("sync beside serve %d killed", round+1), subscribed...)
			return
		}
		e.runToEnd(env, append([]string{"sync"}, res...)...)
	})
	tgt.check()
	missing := 0
	for _, r := range subscribed {
		for _, o := range e.sim.Objects(r) {
			if key := backstop.DedupKey(r, o.ID, o.UpdatedAt); !tgt.deliveredKey(key) {
				missing++
				if missing <= 5 {
					t.Errorf("the platform's current version %s never reached the target", key)
				}
			}
		}
	}
	if missing > 0 {
		t.Errorf("%d current versions never reached the target", missing)
	}
	e.assertMirrorEqualsSim(subscribed...)
}

// serve taking a stream of signed webhooks (duplicated, reordered) while it
// delivers to a target that fails some first attempts, SIGKILLed at
// moments drawn from the seed and restarted: every webhook answered 2xx is
// stored, every delivery row reaches the target under one id per version,
// every version of the subscribed resources that the platform announced
// last reaches it, and the mirror ends equal to the platform.
func TestAuditCrashServeWebhooksAndDelivery(t *testing.T) {
	t.Parallel()
	rng := crashSeed(t)
	tgt := newCrashTarget(t)
	target := httptest.NewServer(tgt)
	defer target.Close()
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{
		Seed: 43, Objects: 100, BigObjects: 5,
		WebhookURL: "http://" + addr + "/webhooks/botix", WebhookSecret: webhookSecret,
		WebhookWorkers: 8, DuplicateRate: 0.05, ReorderRate: 0.05,
		RetrySchedule: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond,
			400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond, 3200 * time.Millisecond, 6400 * time.Millisecond},
	}})
	// A sync and a full reconcile job run under serve as well, so that a
	// version may be emitted by a webhook, a page or a comparison, whichever
	// commits first, across the kills.
	e.writeServeConfig(addr, crashTargetConfig(target.URL, "payment.*", "contact.*", "chat.*", "message.*")+`jobs:
  - {name: audit-sync, kind: sync, every: 1s}
  - {name: audit-reconcile, kind: reconcile, every: 2s, full: true}
`)
	env := append(e.environ(e.sim.APIKey()), "BOTIX_WEBHOOK_SECRET="+webhookSecret)
	// The first fill, before any event.
	e.runToEnd(env, "backfill")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.sim.StartWebhooks(ctx)
	// Each round adds changes once serve is up, so that webhooks arrive
	// before, across and after every kill.
	during := func(round int) {
		e.sim.Mutate(300 + rng.IntN(300))
	}
	// Kills at webhook attempts land mid-stream (some attempts fail and
	// are retried by the platform; the last one during serve's drain
	// after SIGTERM), the other mid-delivery.
	attempts := func() int { return e.sim.WebhookStats().Attempts }
	kills := []crashPoint{
		{what: "webhook attempts", n: 20 + rng.IntN(250), count: attempts},
		targetHits(tgt, 20+rng.IntN(300)),
		{what: "webhook attempts", n: 20 + rng.IntN(250), count: attempts, term: true},
	}
	idleDone := make(chan error, 1)
	e.serveThroughKills(env, tgt, kills, func(round int) {
		during(round)
		if round == len(kills) {
			// The last serve stays up until the platform's retries are
			// over, and only then is its queue drained.
			idle, stop := context.WithTimeout(ctx, 2*time.Minute)
			defer stop()
			idleDone <- e.sim.WebhooksIdle(idle)
		}
	})
	if err := <-idleDone; err != nil {
		t.Fatalf("the platform's webhooks did not finish: %v", err)
	}
	tgt.check()

	db := e.openStore()
	defer db.Close()
	st := e.sim.WebhookStats()
	if st.GaveUp > 0 {
		t.Errorf("the platform gave up on %d deliveries: serve did not come back in time", st.GaveUp)
	}
	lost, announced := 0, map[string]sim.SentEvent{}
	for _, ev := range e.sim.Events() {
		if !ev.Delivered {
			continue
		}
		key := backstop.DedupKey(ev.Resource, ev.ObjectID, ev.UpdatedAt)
		_, ok, err := db.ProcessedEvent(ctx, ev.ID)
		if err == nil && !ok {
			// A duplicate of the version a page or a comparison
			// emitted first is acknowledged and not stored again.
			_, ok, err = db.ProcessedEvent(ctx, backstop.EventID(key))
		}
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			lost++
			if lost <= 5 {
				t.Errorf("webhook %s (%s) was answered 2xx but neither it nor its version is stored", ev.ID, key)
			}
			continue
		}
		k := string(ev.Resource) + ":" + ev.ObjectID
		if prev, seen := announced[k]; !seen || ev.UpdatedAt.After(prev.UpdatedAt) {
			announced[k] = ev
		}
	}
	if lost > 0 {
		t.Fatalf("%d acknowledged webhooks lost", lost)
	}
	missing := 0
	for _, ev := range announced {
		cur, ok := e.sim.Object(ev.Resource, ev.ObjectID)
		if !ok || !cur.UpdatedAt.Equal(ev.UpdatedAt) {
			continue
		}
		if ev.Truncated {
			continue // the target gets only its id (max_payload)
		}
		if key := backstop.DedupKey(ev.Resource, ev.ObjectID, ev.UpdatedAt); !tgt.deliveredKey(key) {
			missing++
			if missing <= 5 {
				t.Errorf("the platform's last version %s (webhook %s) never reached the target", key, ev.ID)
			}
		}
	}
	if missing > 0 {
		t.Errorf("%d last versions never reached the target", missing)
	}
	t.Logf("webhook events %d (%d duplicated, %d reordered), attempts %d, retries %d; %d objects changed",
		st.Events, st.Duplicated, st.Reordered, st.Attempts, st.Retries, len(announced))
	e.assertMirrorEqualsSim()
}
