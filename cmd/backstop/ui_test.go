package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	stdsync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/cmd/backstop/config"
	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/sources"
	"github.com/backstop-sync/backstop/sources/governor"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// Secrets of the dashboard test's configuration; no page may show them.
const (
	uiToken        = "dash-token-5f1c0e2b9d"
	uiTargetSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	uiHeaderSecret = "header-secret-8d1e"
)

// stepTimeout bounds one browser step: generous, for a loaded 2-core CI
// machine running other packages under -race beside this one.
const stepTimeout = time.Minute

// bodyLog is an HTTP endpoint that answers 200 and keeps every body it
// receives by X-Event-Id (the test target, and the redirect's recorder).
type bodyLog struct {
	mu     stdsync.Mutex
	bodies map[string][]string
}

func (l *bodyLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	l.mu.Lock()
	if l.bodies == nil {
		l.bodies = map[string][]string{}
	}
	id := r.Header.Get("X-Event-Id")
	l.bodies[id] = append(l.bodies[id], string(b))
	l.mu.Unlock()
}

// got returns the bodies received for eventID.
func (l *bodyLog) got(eventID string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.bodies[eventID]...)
}

// uiSeed is what seedDashboard put in the store.
type uiSeed struct {
	dead     []int64 // billing's dead letters, oldest first
	crmDead  int64
	payloads map[int64]string
}

// seedDashboard fills the store with what the pages show: dead letters
// and deliveries with their attempts, a job run, a reconcile report, a
// cursor, events of three origins and quota and intake samples.
func seedDashboard(t *testing.T, path, keyID string) uiSeed {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	now := time.Now()
	seed := uiSeed{payloads: map[int64]string{}}
	deliver := func(target, eventID, eventType string, code int, status string) int64 {
		t.Helper()
		payload := fmt.Sprintf(`{"event_id":%q,"event":%q,"created_at":%q,"origin":"webhook","data":{"id":"pay_%s","amount":4200}}`,
			eventID, eventType, now.UTC().Format(time.RFC3339), eventID)
		id, err := db.Enqueue(ctx, target, eventID, eventType, json.RawMessage(payload), now.Add(-time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		seed.payloads[id] = payload
		a := store.Attempt{DeliveryID: id, Target: target, URL: "http://billing.invalid/hooks", Attempt: 1, StatusCode: code,
			Body: fmt.Sprintf(`{"error":"answer %d to %s"}`, code, eventID), RequestID: "req-" + eventID,
			Duration: 42 * time.Millisecond, At: now.Add(-50 * time.Minute)}
		if _, err := db.RecordAttempt(ctx, a, store.Outcome{Status: status}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	for i := range 3 {
		seed.dead = append(seed.dead, deliver("billing", fmt.Sprintf("evt_dead_%d", i), "payment.failed", 400, store.StatusDeadLetter))
	}
	deliver("billing", "evt_ok_1", "payment.succeeded", 200, store.StatusDelivered)
	seed.crmDead = deliver("crm", "evt_crm_dead", "contact.updated", 404, store.StatusDeadLetter)

	if _, err := db.SaveJobRun(ctx, store.JobRun{Job: "payments-hourly", Kind: "reconcile", StartedAt: now.Add(-2 * time.Hour),
		FinishedAt: now.Add(-2*time.Hour + 3*time.Second), Status: "ok",
		Counts: backstop.JobCounts{Pages: 2, Objects: 120, Missing: 3, Behind: 1, Reemitted: 4, Requests: 2}}); err != nil {
		t.Fatal(err)
	}
	rep := backstop.ReconcileReport{Resource: backstop.Payments, StartedAt: now.Add(-2 * time.Hour), Since: now.Add(-3 * time.Hour)}
	runID, err := db.StartReconcile(ctx, rep)
	if err != nil {
		t.Fatal(err)
	}
	rep.Pages, rep.Scanned, rep.Missing, rep.Behind, rep.Reemitted, rep.Suppressed = 2, 120, 3, 1, 4, 1
	if err := db.FinishReconcile(ctx, runID, rep); err != nil {
		t.Fatal(err)
	}
	if _, err := db.AdvanceCursor(ctx, backstop.Cursor{Resource: backstop.Contacts, Kind: backstop.CursorSync, Value: "c_abc",
		Position: backstop.Position{UpdatedAt: now.Add(-time.Hour), ID: "ct_9"}}); err != nil {
		t.Fatal(err)
	}
	var events []backstop.Event
	for i, o := range []backstop.Origin{backstop.OriginWebhook, backstop.OriginWebhook, backstop.OriginSync, backstop.OriginReconcile} {
		id := fmt.Sprintf("ct_seed_%d", i)
		events = append(events, backstop.Event{ID: "evt_" + id, Type: "contact.created", Resource: backstop.Contacts,
			ObjectID: id, UpdatedAt: now, CreatedAt: now, Origin: o, Data: json.RawMessage(`{"id":"` + id + `"}`)})
	}
	if _, err := db.Emit(ctx, events, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		at := now.Add(-time.Duration(i) * 20 * time.Minute)
		if err := db.SaveQuotaSample(ctx, store.QuotaSample{KeyID: keyID, At: at, Limit: 600, Remaining: 600 - 50*i,
			Reset: at.Add(time.Minute), Requests: 40 + i, RateLimited: i % 2, ThrottleWait: time.Duration(i) * time.Second}); err != nil {
			t.Fatal(err)
		}
		if err := db.SaveIntakeSample(ctx, store.IntakeSample{At: at, Duplicates: i, SignatureFailures: 1}); err != nil {
			t.Fatal(err)
		}
	}
	return seed
}

// browser is one headless Chromium tab on the dashboard.
type browser struct {
	t         *testing.T
	ctx       context.Context
	base      string
	artifacts string
}

// newBrowser starts headless Chromium. It fails the test, never skips it,
// when Chromium cannot be started: make test installs it
// (scripts/test-deps).
func newBrowser(t *testing.T, base string) *browser {
	t.Helper()
	execPath := os.Getenv("BACKSTOP_CHROMIUM")
	if execPath == "" {
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
			if p, err := exec.LookPath(name); err == nil {
				execPath = p
				break
			}
		}
	}
	if execPath == "" {
		t.Fatal("no Chromium on PATH (chromium, chromium-browser, google-chrome or headless-shell; or set BACKSTOP_CHROMIUM): run scripts/test-deps")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(execPath),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancelCtx()
		cancelAlloc()
	})
	// The first run starts the browser; it must not carry a timeout (that
	// would end the browser), so the start is bounded from outside.
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx, chromedp.Navigate("about:blank")) }()
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("start Chromium (%s): %v", execPath, err)
		}
	case <-time.After(stepTimeout):
		t.Fatalf("Chromium (%s) did not start within %s", execPath, stepTimeout)
	}
	dir := os.Getenv("BACKSTOP_ARTIFACTS")
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "backstop-dashboard-"); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("dashboard screenshots go to %s", dir)
	return &browser{t: t, ctx: ctx, base: base, artifacts: dir}
}

// do runs steps within stepTimeout, failing the test with what on error.
func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// get runs one action within stepTimeout and returns its value.
func get[T any](b *browser, what string, a chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
	return v
}

// open navigates to a dashboard path and waits for its heading.
func (b *browser) open(path string) {
	b.t.Helper()
	b.do("open "+path, chromedp.Navigate(b.base+path), chromedp.WaitVisible(chromedp.CSS("main h1")))
}

// waitLocation waits until the tab's document is at a URL containing
// substr (after a form submission navigated it) and has loaded: a page
// measured or photographed while its stylesheet is still on the way has
// no layout yet, or is replaced under the screenshot. The URL and the
// state are read in one evaluation, in the document that holds them; one
// that fails while the tab moves from page to page is tried again.
func (b *browser) waitLocation(substr string) string {
	b.t.Helper()
	deadline := time.Now().Add(stepTimeout)
	for {
		type docState struct {
			Href  string `json:"href"`
			Ready string `json:"ready"`
		}
		ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
		state, err := chromedp.Run(ctx, chromedp.Evaluate[docState](`({href: location.href, ready: document.readyState})`))
		cancel()
		if err == nil && strings.Contains(state.Href, substr) && state.Ready == "complete" {
			b.do("wait for the page", chromedp.WaitVisible(chromedp.CSS("main h1")))
			return state.Href
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("the browser is at %s (%s, %v), not at a loaded page whose URL contains %q", state.Href, state.Ready, err, substr)
		}
		time.Sleep(50 * time.Millisecond) // polling the tab's document, with a deadline
	}
}

// text returns the visible text of the first element sel matches.
func (b *browser) text(sel string) string {
	b.t.Helper()
	return get(b, "read "+sel, chromedp.Text(chromedp.CSS(sel)))
}

// count returns how many elements sel matches.
func (b *browser) count(sel string) int {
	b.t.Helper()
	return get(b, "count "+sel, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
}

// html returns the page's HTML.
func (b *browser) html() string {
	b.t.Helper()
	return get(b, "read the page", chromedp.Evaluate[string](`document.documentElement.outerHTML`))
}

// shot saves a full-page PNG screenshot as an artifact.
func (b *browser) shot(name string) {
	b.t.Helper()
	// A screenshot is evidence for a person, not what a test asserts (it
	// measures the page): one Chromium does not take, which it seldom
	// fails to (detached from the page, or no frame within a minute), is
	// tried twice more and then logged as missing.
	var png []byte
	var err error
	for try := 0; try < 3 && (try == 0 || err != nil); try++ {
		ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
		png, err = chromedp.Run(ctx, chromedp.FullScreenshot(100))
		cancel()
	}
	if err != nil {
		b.t.Logf("screenshot %s not taken: %v", name, err)
		return
	}
	path := filepath.Join(b.artifacts, "dashboard-"+name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// noSecrets fails when the page shows any of the configuration's secrets.
func (b *browser) noSecrets(page string, secrets ...string) {
	b.t.Helper()
	h := b.html()
	for _, s := range secrets {
		if strings.Contains(h, s) {
			b.t.Errorf("the %s page shows a secret (%.6s…)", page, s)
		}
	}
}

// The dashboard in headless Chromium against serve with seeded data: the
// login, the dead-letter filter, an expanded row, Retry (and a double
// submission of it), Redirect to a recorder, a POST without the CSRF token,
// "run now", and a screenshot of every page.
func TestDashboardInBrowser(t *testing.T) {
	target, recorder := &bodyLog{}, &bodyLog{}
	targetSrv, recorderSrv := httptest.NewServer(target), httptest.NewServer(recorder)
	defer targetSrv.Close()
	defer recorderSrv.Close()

	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 3, Objects: 20}})
	e.writeServeConfig(addr, fmt.Sprintf(`targets:
  - name: billing
    url: %s
    secret: %s
    headers: {X-Billing-Key: %s}
    allow_private: true
    events: ["payment.*"]
    retry_schedule: [100ms, 200ms]
  - {name: crm, url: "http://127.0.0.1:9/hooks", events: ["contact.*"], allow_private: true}
jobs:
  - {name: payments-hourly, kind: reconcile, resources: [payments], cron: "0 * * * *", lookback: 10m}
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`, targetSrv.URL, uiTargetSecret, uiHeaderSecret))
	apiKey := e.sim.APIKey()
	seed := seedDashboard(t, e.db, governor.KeyID(apiKey))
	env := append(e.environ(apiKey), "BOTIX_WEBHOOK_SECRET="+webhookSecret, "BACKSTOP_DASHBOARD_TOKEN="+uiToken)
	proc, lines := e.startBinaryEnv(env, "serve")
	waitLines(t, lines, "serving", 1, stepTimeout)
	defer func() {
		proc.cmd.Process.Signal(syscall.SIGTERM)
		proc.cmd.Wait()
	}()
	secrets := []string{uiToken, uiTargetSecret, uiHeaderSecret, apiKey, webhookSecret}
	base := "http://" + addr
	b := newBrowser(t, base)

	// Not signed in: sent to the login page, then back where it was going.
	b.open("/ui/dead-letters")
	if loc := b.waitLocation("/ui/login"); !strings.Contains(loc, "next=") {
		t.Errorf("login page at %s does not remember where the browser was going", loc)
	}
	b.shot("login")
	b.do("sign in with a wrong token", chromedp.SendKeys(chromedp.CSS("#token"), "not-the-token"), chromedp.Click(chromedp.CSS("#sign-in")),
		chromedp.WaitVisible(chromedp.CSS("#login-error")))
	b.do("sign in", chromedp.SendKeys(chromedp.CSS("#token"), uiToken), chromedp.Click(chromedp.CSS("#sign-in")))
	b.waitLocation("/ui/dead-letters")
	cookies := get(b, "read the cookies", chromedp.Evaluate[string](`document.cookie`))
	if strings.Contains(cookies, "backstop_session") {
		t.Errorf("the session cookie is readable from script: %q", cookies)
	}
	if n := b.count("#targets .retry-dead"); n != 2 {
		t.Errorf("%d retry-all buttons, want one per target with dead letters (2)", n)
	}
	b.shot("dead-letters")
	b.noSecrets("dead letters", secrets...)

	// Filter the delivery log down to billing's dead letters.
	b.open("/ui/deliveries")
	if n := b.count("#log details.row"); n != 5 {
		t.Errorf("the log lists %d deliveries, want all 5", n)
	}
	b.do("filter dead letters of billing",
		chromedp.SetValue(chromedp.CSS("#f-status"), "dead_letter"),
		chromedp.SetValue(chromedp.CSS("#f-target"), "billing"),
		chromedp.Click(chromedp.CSS("#apply")))
	b.waitLocation("status=dead_letter")
	if n, dead := b.count("#log details.row"), b.count("#log details.row .c-status .b-dead-letter"); n != 3 || dead != 3 {
		t.Errorf("filtered log: %d rows, %d dead letters; want billing's 3 dead letters only", n, dead)
	}
	b.shot("deliveries-dead-letters")
	b.noSecrets("deliveries", secrets...)

	// Expand a row: URL, payload, HTTP code, response body, request id,
	// time and attempt number.
	first := seed.dead[0]
	row := fmt.Sprintf("#delivery-%d", first)
	b.do("expand a row", chromedp.Click(chromedp.CSS(row+" > summary")), chromedp.WaitVisible(chromedp.CSS(row+" .payload")))
	expanded := b.text(row + " .expanded")
	for _, want := range []string{"http://billing.invalid/hooks", `"event_id": "evt_dead_0"`, "400", `{"error":"answer 400 to evt_dead_0"}`,
		"req-evt_dead_0", "UTC", "Retry", "Redirect"} {
		if !strings.Contains(expanded, want) {
			t.Errorf("expanded row lacks %q:\n%s", want, expanded)
		}
	}
	b.shot("deliveries-expanded")

	// A POST without the CSRF token is refused, and changes nothing.
	status := get(b, "post without CSRF", chromedp.Evaluate[string](fmt.Sprintf(`fetch("/ui/deliveries/%d/retry", {method: "POST",
		headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "status=dead_letter"})
		.then(r => r.text().then(t => r.status + " " + t))`, first), chromedp.EvalAwaitPromise))
	if !strings.HasPrefix(status, "403 ") || !strings.Contains(status, `"csrf"`) {
		t.Errorf("POST without CSRF token: %s, want 403 with code csrf", status)
	}
	if got := deliveryStatus(t, e.db, first); got != store.StatusDeadLetter {
		t.Errorf("after the refused POST the delivery is %s, want still dead_letter", got)
	}

	// Retry: the delivery gets one new attempt, delivered to the target.
	b.do("press Retry", chromedp.Click(chromedp.CSS(row+" .retry-button")))
	b.waitLocation(fmt.Sprintf("/ui/deliveries/%d", first))
	if flash := b.text("#flash"); !strings.Contains(flash, "queued again") {
		t.Errorf("after Retry the page says %q", flash)
	}
	b.eventually("the retried delivery's new attempt", func() bool {
		return b.count(row+" tbody.attempt") == 2 && strings.Contains(b.text(row+" .c-status"), "delivered")
	})
	if got := target.got("evt_dead_0"); len(got) != 1 || got[0] != seed.payloads[first] {
		t.Errorf("the target received %q for the retried delivery, want its payload once", got)
	}
	b.shot("delivery-retried")

	// A double-submitted Retry (the same form sent twice) makes one attempt.
	second := seed.dead[1]
	b.open(fmt.Sprintf("/ui/deliveries/%d", second))
	answers := get(b, "submit Retry twice", chromedp.Evaluate[[]string](fmt.Sprintf(`(() => {
		const f = document.querySelector("#delivery-%d form.retry");
		const post = () => fetch(f.action, {method: "POST", body: new URLSearchParams(new FormData(f))})
			.then(r => r.text().then(t => r.status + " " + t));
		return Promise.all([post(), post()]);
	})()`, second), chromedp.EvalAwaitPromise))
	queued := 0
	for _, a := range answers {
		if strings.HasPrefix(a, "200 ") && strings.Contains(a, "queued again") {
			queued++
		} else if !strings.HasPrefix(a, "409 ") || !strings.Contains(a, "nothing was done") {
			t.Errorf("a submission of Retry was answered %s, want 200 (queued) or 409 (nothing done)", a)
		}
	}
	if queued != 1 {
		t.Errorf("%d of the 2 submissions of one Retry form queued the delivery, want 1: %q", queued, answers)
	}
	waitFor(t, stepTimeout, func() bool { return deliveryStatus(t, e.db, second) == store.StatusDelivered })
	if got := target.got("evt_dead_1"); len(got) != 1 {
		t.Errorf("a double-submitted Retry made %d attempts, want 1", len(got))
	}

	// Redirect to a local recorder: the payload arrives there as queued.
	third := seed.dead[2]
	b.open(fmt.Sprintf("/ui/deliveries/%d", third))
	b.do("redirect", chromedp.SendKeys(chromedp.CSS(fmt.Sprintf("#delivery-%d input[name=url]", third)), recorderSrv.URL+"/inspect"),
		chromedp.Click(chromedp.CSS(fmt.Sprintf("#delivery-%d .redirect-button", third))))
	b.do("wait for the redirect's answer", chromedp.WaitVisible(chromedp.CSS("#flash")))
	if flash := b.text("#flash"); !strings.Contains(flash, "200") {
		t.Errorf("after Redirect the page says %q", flash)
	}
	if got := recorder.got("evt_dead_2"); len(got) != 1 || got[0] != seed.payloads[third] {
		t.Errorf("the recorder received %q, want the payload %s once", got, seed.payloads[third])
	}
	if n := b.count(fmt.Sprintf("#delivery-%d .b-redirect", third)); n != 1 {
		t.Errorf("%d redirect attempts listed, want 1", n)
	}
	if got := deliveryStatus(t, e.db, third); got != store.StatusDeadLetter {
		t.Errorf("a redirect changed the delivery to %s", got)
	}
	b.shot("delivery-redirected")

	// Retry all dead letters of one target.
	b.open("/ui/dead-letters")
	b.do("retry all dead for crm", chromedp.Click(chromedp.CSS("#target-crm .retry-dead")))
	b.do("wait for the retry-all answer", chromedp.WaitVisible(chromedp.CSS("#flash")))
	if flash := b.text("#flash"); !strings.Contains(flash, "1 dead letters of crm queued again") {
		t.Errorf("after retry-all the page says %q", flash)
	}

	// Jobs: the seeded run and report, the cursor, and "run now".
	b.open("/ui/jobs")
	jobs := b.text("main")
	for _, want := range []string{"payments-hourly", "cron 0 * * * *", "Reconciliation reports", "contacts", "ct_9"} {
		if !strings.Contains(jobs, want) {
			t.Errorf("jobs page lacks %q", want)
		}
	}
	if got := b.text("#reports tbody tr"); !strings.Contains(got, "120") || !strings.Contains(got, "payments") {
		t.Errorf("reconcile report row: %q", got)
	}
	b.shot("jobs")
	b.do("run now", chromedp.Click(chromedp.CSS("#job-payments-hourly .run-now")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if flash := b.text("#flash"); !strings.Contains(flash, "payments-hourly started") {
		t.Errorf("after Run now the page says %q", flash)
	}
	b.eventually("the job's new run", func() bool { return b.count("#job-payments-hourly .runs tbody tr") >= 2 })
	b.noSecrets("jobs", secrets...)

	// Quota and intake: figures and their charts.
	b.open("/ui/quota?range=6h")
	if got := b.text(".key .keyid"); got != governor.KeyID(apiKey) {
		t.Errorf("quota page shows key %q, want its KeyID %s", got, governor.KeyID(apiKey))
	}
	if n := b.count(".key svg rect"); n == 0 {
		t.Error("the quota charts have no bars")
	}
	b.shot("quota")
	b.noSecrets("quota", secrets...)
	b.open("/ui/intake")
	if got := b.text("#origin-webhook"); got != "2" {
		t.Errorf("intake page: %s webhook events, want the 2 seeded", got)
	}
	if n := b.count("svg rect.s-sync"); n != 1 {
		t.Errorf("the intake chart has %d sync bars, want 1", n)
	}
	b.shot("intake")
	b.noSecrets("intake", secrets...)

	// A delivery that does not exist: a page saying so.
	b.open("/ui/deliveries/999999")
	if got := b.text("#error .message"); !strings.Contains(got, "no delivery 999999") {
		t.Errorf("error page says %q", got)
	}
	b.shot("not-found")

	// Signed out: sent to the login page again.
	b.do("sign out", chromedp.Click(chromedp.CSS(".logout button")))
	b.waitLocation("/ui/login")
	b.open("/ui/jobs")
	b.waitLocation("/ui/login?next=%2Fui%2Fjobs")
}

// eventually reloads the page until cond holds, or fails after stepTimeout.
func (b *browser) eventually(what string, cond func() bool) {
	b.t.Helper()
	deadline := time.Now().Add(stepTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			b.shot("failed")
			b.t.Fatalf("%s: not seen within %s", what, stepTimeout)
		}
		time.Sleep(100 * time.Millisecond) // polling the page, with a deadline
		b.do("reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("main h1")))
	}
}

// deliveryStatus reads a delivery's status from the store serve writes.
func deliveryStatus(t *testing.T, path string, id int64) string {
	t.Helper()
	db, err := store.Open(context.Background(), path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	row, ok, err := db.Delivery(context.Background(), id)
	if err != nil || !ok {
		t.Fatalf("delivery %d: %v, %v", id, ok, err)
	}
	return row.Status
}

// The sampler records what the metered source's calls cost since the last
// sample, the governor's budget as the platform reported it, and the
// intake's duplicates and signature failures since the last sample.
func TestSamplerRecordsQuotaAndIntake(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 5, Objects: 30, Limit: 500}})
	db := e.openStore()
	defer db.Close()
	gov := governor.New(e.sim.APIKey(), governor.Options{Limit: 500})
	client, err := sources.New(sources.Options{BaseURL: e.srv.URL, APIKey: e.sim.APIKey(), Governor: gov})
	if err != nil {
		t.Fatal(err)
	}
	meter := &quotaMeter{Source: client}
	metrics := intake.NewMetrics(prometheus.NewRegistry())
	clk := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	s := &sampler{db: db, gov: gov, meter: meter, intake: metrics, log: slog.New(slog.DiscardHandler),
		now: func() time.Time { return clk }}
	list := func(pages int) {
		t.Helper()
		cursor := ""
		for range pages {
			p, err := meter.List(ctx, backstop.ListRequest{Resource: backstop.Contacts, Cursor: cursor, Limit: 5})
			if err != nil {
				t.Fatal(err)
			}
			cursor = p.NextCursor
		}
	}

	list(3)
	metrics.Duplicates.Add(2)
	metrics.SignatureFailures.Inc()
	s.sample(ctx)
	clk = clk.Add(time.Minute)
	list(2)
	s.sample(ctx)

	qs, err := db.QuotaSamples(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) != 2 || qs[0].Requests != 3 || qs[1].Requests != 2 || qs[0].RateLimited != 0 {
		t.Fatalf("quota samples %+v, want 3 then 2 requests", qs)
	}
	if q := qs[1]; q.KeyID != gov.KeyID() || q.Limit != 500 || q.Remaining != 495 || q.Reset.IsZero() {
		t.Errorf("second sample %+v, want key %s with the sim's budget: 500, 495 left", q, gov.KeyID())
	}
	in, err := db.IntakeSamples(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(in) != 2 || in[0].Duplicates != 2 || in[0].SignatureFailures != 1 || in[1].Duplicates != 0 || in[1].SignatureFailures != 0 {
		t.Errorf("intake samples %+v, want 2 duplicates and 1 failure, then none", in)
	}
}

// Without dashboard.token, /ui answers 404 saying how to turn it on.
func TestDashboardOffWithoutToken(t *testing.T) {
	cfg := config.Default()
	u, err := startUI(context.Background(), uiDeps{a: &app{cfg: cfg}})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close(context.Background())
	rec := httptest.NewRecorder()
	u.handler.ServeHTTP(rec, httptest.NewRequest("GET", "/ui/deliveries", nil))
	if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "set dashboard.token") {
		t.Errorf("/ui without a token: %d %s", rec.Code, rec.Body)
	}
}

// A command run from system cron counts on the Quota page too: `backstop
// sync` stores, as it closes, one sample with what its requests cost; a
// command that made none stores nothing.
func TestCommandsStoreTheirQuotaSample(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 6, Objects: 30, Limit: 500}})
	e.openStore().Close() // cursors reads a database; it does not create one
	if code, _, stderr := e.run(ctx, "cursors"); code != exitOK {
		t.Fatalf("cursors: exit %d\n%s", code, stderr)
	}
	if code, _, stderr := e.run(ctx, "sync", "contacts"); code != exitOK {
		t.Fatalf("sync: exit %d\n%s", code, stderr)
	}
	db := e.openStore()
	defer db.Close()
	qs, err := db.QuotaSamples(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	made := e.sim.Stats().Requests
	if len(qs) != 1 || qs[0].Requests != made || made == 0 {
		t.Fatalf("quota samples %+v, want one with the sync's %d requests", qs, made)
	}
	if q := qs[0]; q.KeyID != governor.KeyID(e.sim.APIKey()) || q.Limit != 500 || q.Remaining != 500-made {
		t.Errorf("sample %+v, want the sim's budget of the key: 500, %d left", q, 500-made)
	}
}
