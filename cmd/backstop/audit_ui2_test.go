package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// logRowIDs returns the ids of the delivery rows a page of the log lists,
// in order.
func logRowIDs(page string) []string {
	var ids []string
	for _, m := range regexp.MustCompile(`<details class="row" id="delivery-(\d+)"`).FindAllStringSubmatch(page, -1) {
		ids = append(ids, m[1])
	}
	return ids
}

// listsRow reports whether a page of the log lists the delivery id.
func listsRow(page string, id int64) bool {
	return strings.Contains(page, fmt.Sprintf(`id="delivery-%d"`, id))
}

// The log's 14-day window is for delivered rows: a disabled target's
// backlog queued three weeks ago, and a dead letter as old, are in the log
// (the Dead letters page counts them), and so is that dead letter once
// Retry has queued it again; only the delivered row that old is left out.
func TestDashboardLogListsOldQueuedRowsAndDeadLetters(t *testing.T) {
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeServeConfig(addr, `targets:
  - {name: crm, url: "http://127.0.0.1:9/hooks", allow_private: true}
  - {name: billing, url: "http://127.0.0.1:9/hooks", allow_private: true}
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`)
	ctx := context.Background()
	db := e.openStore()
	now := time.Now()
	old := now.Add(-21 * 24 * time.Hour)
	for _, name := range []string{"crm", "billing"} {
		if err := db.DisableTarget(ctx, name, "answered 410 Gone", old); err != nil {
			t.Fatal(err)
		}
	}
	backlog, err := db.Enqueue(ctx, "crm", "evt_backlog", "proxy", []byte(`{"n":1}`), old)
	if err != nil {
		t.Fatal(err)
	}
	dead := enqueueDeadLetter(t, ctx, db, "billing", "evt_dead", "http://127.0.0.1:9/hooks", http.StatusBadRequest, old)
	delivered := func(eventID string, at time.Time) int64 {
		id, err := db.Enqueue(ctx, "billing", eventID, "proxy", []byte(`{"n":2}`), at)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.RecordAttempt(ctx, store.Attempt{DeliveryID: id, Target: "billing", URL: "http://127.0.0.1:9/hooks",
			Attempt: 1, StatusCode: http.StatusOK, RequestID: "req-" + eventID, At: at}, store.Outcome{Status: store.StatusDelivered}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	oldDelivered := delivered("evt_old_delivered", old)
	newDelivered := delivered("evt_new_delivered", now)
	db.Close()
	stop := e.serveWithDashboard()
	defer stop()

	base := "http://" + addr
	deadPage := bearerPage(t, base+"/ui/dead-letters")
	if !listsRow(deadPage, dead) {
		t.Errorf("the Dead letters page lacks the dead letter %d", dead)
	}
	for _, c := range []struct {
		path string
		want []int64
		not  []int64
	}{
		{"/ui/deliveries", []int64{backlog, dead, newDelivered}, []int64{oldDelivered}},
		{"/ui/deliveries?status=pending", []int64{backlog}, nil},
		{"/ui/deliveries?status=dead_letter", []int64{dead}, nil},
		{"/ui/deliveries?status=delivered", []int64{newDelivered}, []int64{oldDelivered}},
	} {
		page := bearerPage(t, base+c.path)
		for _, id := range c.want {
			if !listsRow(page, id) {
				t.Errorf("%s lacks delivery %d (lists %v)", c.path, id, logRowIDs(page))
			}
		}
		for _, id := range c.not {
			if listsRow(page, id) {
				t.Errorf("%s lists delivery %d, delivered three weeks ago, outside its window", c.path, id)
			}
		}
	}

	code, body := dashboardPost(t, addr, fmt.Sprintf("/ui/deliveries/%d/retry", dead), url.Values{})
	if code != http.StatusOK {
		t.Fatalf("retry of delivery %d: %d %s", dead, code, body)
	}
	if page := bearerPage(t, base+"/ui/deliveries?status=pending"); !listsRow(page, dead) {
		t.Errorf("the dead letter %d queued again by Retry is not in the log's pending deliveries (lists %v)", dead, logRowIDs(page))
	}
}

// Run now while a scheduled run of the job is going answered "started",
// yet the scheduler skipped the run asked for. It now answers 409 saying
// that the job is already running, and the Jobs page shows it running
// (Run now disabled) until the scheduled run ends.
func TestDashboardRunNowDuringAScheduledRunSaysItIsRunning(t *testing.T) {
	var (
		once    sync.Once
		reached = make(chan struct{})
		release = make(chan struct{})
	)
	// The scheduled sync hangs on its first contacts page until released.
	gate := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(r.URL.Path, "contacts") {
				once.Do(func() { close(reached) })
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
			}
			next.ServeHTTP(w, r)
		})
	}
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 3}, wrap: gate})
	e.writeServeConfig(addr, `jobs:
  - {name: crm-sync, kind: sync, resources: [contacts], every: 1s}
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`)
	stop := e.serveWithDashboard()
	defer stop()
	var released sync.Once
	open := func() { released.Do(func() { close(release) }) }
	defer open()
	select {
	case <-reached:
	case <-time.After(stepTimeout):
		t.Fatal("the scheduled run of crm-sync never asked for contacts")
	}

	code, body := dashboardPost(t, addr, "/ui/jobs/crm-sync/run", url.Values{})
	if code != http.StatusConflict || !strings.Contains(body, "already running") {
		t.Errorf("Run now during a scheduled run: %d %s; want 409 saying the job is already running", code, body)
	}
	b := newBrowser(t, "http://"+addr)
	b.open("/ui/login?next=/ui/jobs")
	b.do("sign in", chromedp.SendKeys(chromedp.CSS("#token"), uiToken), chromedp.Click(chromedp.CSS("#sign-in")))
	b.waitLocation("/ui/jobs")
	b.shot("jobs-scheduled-run-going")
	if last := b.text("#job-crm-sync tr:first-child td:nth-child(6)"); !strings.HasPrefix(strings.TrimSpace(last), "running") {
		t.Errorf("the Jobs page's Last run of crm-sync is %q, want running", last)
	}
	disabled := get(b, "read Run now", chromedp.Evaluate[bool](`document.querySelector("#job-crm-sync .run-now").disabled`))
	if !disabled {
		t.Error("Run now of crm-sync is enabled while its scheduled run is going")
	}
	open()
}

// olderLink returns the log page's "Older →" link, or "".
func olderLink(page string) string {
	m := regexp.MustCompile(`<a href="([^"]+)" rel="next"`).FindStringSubmatch(page)
	if m == nil {
		return ""
	}
	return strings.ReplaceAll(m[1], "&amp;", "&")
}

// "Older →" skipped 50 rows from the top of the log: deliveries queued
// after the first page was drawn pushed its last rows onto the second,
// listed twice. The second page now starts after the last row the first
// showed: every delivery is listed once.
func TestDashboardLogPagesDoNotDriftAsDeliveriesArrive(t *testing.T) {
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeServeConfig(addr, `targets:
  - {name: crm, url: "http://127.0.0.1:9/hooks", allow_private: true}
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`)
	ctx := context.Background()
	db := e.openStore()
	now := time.Now()
	// Disabled: the rows stay pending, as queued.
	if err := db.DisableTarget(ctx, "crm", "answered 410 Gone", now); err != nil {
		t.Fatal(err)
	}
	enqueueN := func(from, n int) {
		for i := from; i < from+n; i++ {
			if _, err := db.Enqueue(ctx, "crm", fmt.Sprintf("evt_%03d", i), "proxy", []byte(`{"n":1}`), now); err != nil {
				t.Fatal(err)
			}
		}
	}
	enqueueN(0, 60)
	stop := e.serveWithDashboard()
	defer stop()

	base := "http://" + addr
	first := bearerPage(t, base+"/ui/deliveries?target=crm")
	older := olderLink(first)
	if older == "" {
		t.Fatalf("the first page of 60 deliveries has no Older link")
	}
	enqueueN(60, 5) // queued while someone reads the first page
	second := bearerPage(t, base+older)
	seen := map[string]int{}
	for _, id := range append(logRowIDs(first), logRowIDs(second)...) {
		seen[id]++
	}
	for id, n := range seen {
		if n > 1 {
			t.Errorf("delivery %s is listed on both pages", id)
		}
	}
	if len(seen) != 60 {
		t.Errorf("the two pages list %d deliveries, want the 60 queued before the first was drawn (first %v, second %v)",
			len(seen), logRowIDs(first), logRowIDs(second))
	}
	db.Close()
}

// The Jobs page's reconciliation reports showed 0 orphans for runs that
// did not count them (not full, or full but failed or still running);
// they show "-", as backstop reconcile does, and a full run that ended
// its count.
func TestDashboardOrphansOfRunsThatDidNotCountThem(t *testing.T) {
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeServeConfig(addr, `dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`)
	ctx := context.Background()
	db := e.openStore()
	now := time.Now()
	runs := []struct {
		rep    backstop.ReconcileReport
		finish bool
		want   string
	}{
		{backstop.ReconcileReport{Full: true, Orphans: 3}, true, "3"},
		{backstop.ReconcileReport{Full: true}, true, "0"},
		{backstop.ReconcileReport{Since: now.Add(-time.Hour)}, true, "-"},
		{backstop.ReconcileReport{Full: true, Err: errors.New("platform answered 503")}, true, "-"},
		{backstop.ReconcileReport{Full: true}, false, "-"}, // still running
	}
	for i, r := range runs {
		r.rep.Resource = backstop.Contacts
		r.rep.StartedAt = now.Add(time.Duration(i-len(runs)) * time.Minute)
		id, err := db.StartReconcile(ctx, r.rep)
		if err != nil {
			t.Fatal(err)
		}
		if r.finish {
			if err := db.FinishReconcile(ctx, id, r.rep); err != nil {
				t.Fatal(err)
			}
		}
	}
	db.Close()
	stop := e.serveWithDashboard()
	defer stop()

	page := bearerPage(t, "http://"+addr+"/ui/jobs")
	body := regexp.MustCompile(`(?s)<table class="counts" id="reports">.*?<tbody>(.*?)</tbody>`).FindStringSubmatch(page)
	if body == nil {
		t.Fatalf("the Jobs page has no reconciliation reports:\n%s", page)
	}
	cell, tag := regexp.MustCompile(`(?s)<td[^>]*>(.*?)</td>`), regexp.MustCompile(`<[^>]*>`)
	var got []string
	for _, tr := range strings.Split(body[1], "<tr>")[1:] {
		cells := cell.FindAllStringSubmatch(tr, -1)
		if len(cells) < 10 {
			t.Fatalf("a report row has %d cells:\n%s", len(cells), tr)
		}
		// Orphans is the 10th column.
		got = append(got, strings.TrimSpace(tag.ReplaceAllString(cells[9][1], "")))
	}
	// Newest first.
	var want []string
	for i := len(runs) - 1; i >= 0; i-- {
		want = append(want, runs[i].want)
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("the reports' Orphans are %q, want %q (newest first)", got, want)
	}
}

// "Retry all dead" pressed twice (a double click), or from a page shown a
// while ago, queued again every dead letter of the target at the moment of
// the press, including ones that became dead letters after the page was
// shown, and the second press answered "0 dead letters … queued again".
// The button now sends when its page was shown: only the dead letters the
// page showed are queued, and a second press says they are queued already.
func TestDashboardRetryAllDeadQueuesWhatThePageShowed(t *testing.T) {
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeServeConfig(addr, `targets:
  - {name: crm, url: "http://crm.invalid/hook"}
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`)
	ctx := context.Background()
	db := e.openStore()
	now := time.Now()
	shown := now.Add(-time.Hour)
	before := enqueueDeadLetter(t, ctx, db, "crm", "evt_dead_before", "http://crm.invalid/hook", 400, now.Add(-2*time.Hour))
	after := enqueueDeadLetter(t, ctx, db, "crm", "evt_dead_after", "http://crm.invalid/hook", 400, now.Add(-time.Minute))
	// The target is disabled so that nothing is sent meanwhile.
	if err := db.DisableTarget(ctx, "crm", "held for the test", now); err != nil {
		t.Fatal(err)
	}
	db.Close()
	stop := e.serveWithDashboard()
	defer stop()
	form := url.Values{"shown": {shown.UTC().Format(time.RFC3339Nano)}}
	code, body := dashboardPost(t, addr, "/ui/targets/crm/retry-dead", form)
	if code != http.StatusOK || !strings.Contains(body, "1 dead letters of crm queued again") {
		t.Fatalf("retry all dead as shown an hour ago: %d %s; want the one dead letter the page showed", code, body)
	}
	code, body = dashboardPost(t, addr, "/ui/targets/crm/retry-dead", form)
	if code != http.StatusOK || !strings.Contains(body, "queued already") {
		t.Errorf("second press: %d %s; want it to say those shown are queued already", code, body)
	}
	db = e.openStore()
	defer db.Close()
	for id, want := range map[int64]string{before: store.StatusPending, after: store.StatusDeadLetter} {
		row, ok, err := db.Delivery(ctx, id)
		if err != nil || !ok || row.Status != want {
			t.Errorf("delivery %d: %s (ok=%v err=%v), want %s", id, row.Status, ok, err, want)
		}
	}
}

// The Jobs page took any stored "running" row for a run going on, so after
// serve or backstop run was killed (SIGKILL) mid-run the job showed as
// running, with Run now disabled, until the row was closed as abandoned an
// hour after its last heartbeat; and without governor.redis Run now
// started a second run beside one that backstop run, from system cron,
// had going in another process. A running row counts only while it
// beats: a stale one lets Run now start the job, a live one refuses it.
func TestDashboardRunNowTellsALiveRunFromADeadOne(t *testing.T) {
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 3}})
	e.writeServeConfig(addr, `jobs:
  - {name: crm-sync, kind: sync, resources: [contacts], cron: "0 3 1 1 *"}
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`)
	// A run whose process was killed ten minutes ago.
	startRunAt(t, e, "crm-sync", time.Now().Add(-10*time.Minute))
	stop := e.serveWithDashboard()
	if page := bearerPage(t, "http://"+addr+"/ui/jobs"); strings.Contains(page, `class="run-now" disabled`) {
		t.Errorf("the Jobs page shows a run killed 10 minutes ago as running, Run now disabled")
	}
	code, body := dashboardPost(t, addr, "/ui/jobs/crm-sync/run", url.Values{})
	if code == http.StatusConflict || !strings.Contains(body, "crm-sync started") {
		t.Errorf("Run now beside a run killed 10 minutes ago: %d %s; want it started", code, body)
	}
	stop()

	// A run going on now in another process (backstop run from cron).
	startRunAt(t, e, "crm-sync", time.Now())
	stop = e.serveWithDashboard()
	defer stop()
	code, body = dashboardPost(t, addr, "/ui/jobs/crm-sync/run", url.Values{})
	if code != http.StatusConflict || !strings.Contains(body, "already running") {
		t.Errorf("Run now beside a live run in another process: %d %s; want 409 saying it is already running", code, body)
	}
}

// The Jobs page showed a run stored as running whose process is gone as
// "running", like a live one: one killed over three heartbeats ago with
// Run now enabled but no word why, and one killed a moment ago (on this
// host, its pid gone or another process's) with Run now disabled for
// three minutes, though the job's next start closes it as abandoned at
// once. Each now reads "running?" with the reason, as backstop jobs says
// it, and neither holds Run now back.
func TestDashboardJobsSaysWhyAStoredRunIsNotGoingOn(t *testing.T) {
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 3}})
	e.writeServeConfig(addr, `jobs:
  - {name: crm-sync, kind: sync, resources: [contacts], cron: "0 3 1 1 *"}
  - {name: pay-sync, kind: sync, resources: [payments], cron: "0 3 1 1 *"}
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`)
	// crm-sync's run stopped beating ten minutes ago.
	startRunAt(t, e, "crm-sync", time.Now().Add(-10*time.Minute))
	// pay-sync's run beat a moment ago, but its process is gone: its
	// owner is this test's pid with another start time, as a pid taken
	// again by another process reads.
	startRunAt(t, e, "pay-sync", time.Now())
	raw, err := sql.Open("sqlite", e.db+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	var owner string
	if err := raw.QueryRow(`SELECT owner FROM job_runs WHERE job = 'pay-sync'`).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(owner, "/")
	if len(parts) != 4 {
		t.Fatalf("owner %q: want host/pid/start/namespace", owner)
	}
	parts[2] = "1"
	if _, err := raw.Exec(`UPDATE job_runs SET owner = ? WHERE job = 'pay-sync'`, strings.Join(parts, "/")); err != nil {
		t.Fatal(err)
	}
	raw.Close()

	stop := e.serveWithDashboard()
	defer stop()
	page := bearerPage(t, "http://"+addr+"/ui/jobs")
	text := regexp.MustCompile(`<[^>]*>`).ReplaceAllString(page, "")
	crm, pay, ok := strings.Cut(page[strings.Index(page, `id="job-crm-sync"`)+1:], `id="job-pay-sync"`)
	if !regexp.MustCompile(`running\? 1[01]m ago — last heartbeat 1[01]m ago`).MatchString(text) {
		t.Errorf("the Jobs page does not say crm-sync's last run is running? 10m ago — last heartbeat 10m ago")
	}
	// Started before serve was: some seconds ago on a loaded machine.
	if want := regexp.MustCompile(fmt.Sprintf(`running\? \d+s ago — its process \(pid %d on host `, os.Getpid())); !want.MatchString(text) {
		t.Errorf("the Jobs page does not say %s…", want)
	}
	if !ok {
		t.Fatalf("the Jobs page lists no pay-sync after crm-sync:\n%s", page)
	}
	if !strings.Contains(crm, "running?") || strings.Contains(crm, `class="run-now" disabled`) {
		t.Errorf("crm-sync, whose run stopped beating 10 minutes ago: want Run now enabled:\n%s", crm)
	}
	if !strings.Contains(pay, "running?") || strings.Contains(pay, `class="run-now" disabled`) {
		t.Errorf("pay-sync, whose process is gone: want Run now enabled:\n%s", pay)
	}
	code, body := dashboardPost(t, addr, "/ui/jobs/pay-sync/run", url.Values{})
	if code == http.StatusConflict || !strings.Contains(body, "pay-sync started") {
		t.Errorf("Run now of pay-sync, whose process is gone: %d %s; want it started", code, body)
	}
}

// startRunAt stores a run of the sync job job as started, and last beating,
// at at, owned by this test's process.
func startRunAt(t *testing.T, e *env, job string, at time.Time) {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, e.db, store.Options{Now: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.StartJobRun(ctx, store.JobRun{Job: job, Kind: "sync", StartedAt: at}); err != nil {
		t.Fatal(err)
	}
}
