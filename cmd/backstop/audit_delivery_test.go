package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	stdsync "sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// writeOrderConfig writes a configuration whose one target, recorder, has
// a 3 s timeout: a claim may send its rows for 3 s, so a 429 asking for 4 s
// outlasts it and the row it answered is released back to the queue.
func (e *env) writeOrderConfig(addr, targetURL string) {
	e.writeServeConfig(addr, fmt.Sprintf(`  proxy_token: proxy-secret-token
targets:
  - name: recorder
    url: %s
    allow_private: true
    connect_timeout: 1s
    timeout: 3s
`, targetURL))
}

// A row answered 429 keeps its place in its target's queue: once the pause
// ends it is sent before the rows queued while it waited, even when the
// pause outlasts the claim it was sent under (the README: "the row that got
// the 429 keeps its place and is sent again first once the pause ends").
func TestA429dRowIsSentBeforeTheRowsQueuedDuringItsPause(t *testing.T) {
	var (
		mu    stdsync.Mutex
		order []string
	)
	first := make(chan struct{})
	queued := make(chan struct{})
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		id := r.Header.Get("X-Event-Id")
		mu.Lock()
		order = append(order, id)
		n := len(order)
		mu.Unlock()
		if n == 1 {
			// The test queues the next two while this attempt is in
			// flight, then it is answered 429.
			close(first)
			select {
			case <-queued:
			case <-time.After(2500 * time.Millisecond): // within the 3 s timeout
			}
			w.Header().Set("Retry-After", "4")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer target.Close()
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeOrderConfig(addr, target.URL)
	serveInProcess(t, e, addr)

	proxyPost(t, addr, "evt_order_1", `{"n":1}`)
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("the target got no request")
	}
	proxyPost(t, addr, "evt_order_2", `{"n":2}`)
	proxyPost(t, addr, "evt_order_3", `{"n":3}`)
	close(queued)
	waitFor(t, time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) >= 4
	})
	mu.Lock()
	got := slices.Clone(order)
	mu.Unlock()
	want := []string{"evt_order_1", "evt_order_1", "evt_order_2", "evt_order_3"}
	if !slices.Equal(got, want) {
		t.Errorf("the target got %v, want %v: the row answered 429 lost its place", got, want)
	}
}

// serveWithDashboard starts the real binary's serve with the webhook
// secret and the dashboard token in its environment and waits until it is
// serving; stop sends it SIGTERM and waits for it to exit.
func (e *env) serveWithDashboard() (stop func()) {
	e.t.Helper()
	env := append(e.environ(e.sim.APIKey()), "BOTIX_WEBHOOK_SECRET="+webhookSecret, "BACKSTOP_DASHBOARD_TOKEN="+uiToken)
	proc, lines := e.startBinaryEnv(env, "serve")
	waitLines(e.t, lines, "serving", 1, stepTimeout)
	return func() {
		proc.cmd.Process.Signal(syscall.SIGTERM)
		proc.cmd.Wait()
	}
}

// enqueueEach queues one delivery, evt_<target>, for each of targets,
// enqueued at at, and returns their ids by target.
func enqueueEach(t *testing.T, ctx context.Context, db *store.DB, at time.Time, targets ...string) map[string]int64 {
	t.Helper()
	ids := map[string]int64{}
	for _, target := range targets {
		id, err := db.Enqueue(ctx, target, "evt_"+target, "proxy", []byte(`{"n":1}`), at)
		if err != nil {
			t.Fatal(err)
		}
		ids[target] = id
	}
	return ids
}

// The dashboard says when a queued delivery is really attempted, as
// deliveries list does: not its own (past) time while its target is paused
// for longer, disabled after a 410, or gone from the configuration.
func TestDashboardSaysWhenAQueuedRowIsSent(t *testing.T) {
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeServeConfig(addr, `targets:
  - {name: paused, url: "http://127.0.0.1:9/hook", allow_private: true}
  - {name: off, url: "http://127.0.0.1:9/hook", allow_private: true}
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`)
	ctx := context.Background()
	db := e.openStore()
	now := time.Now()
	ids := enqueueEach(t, ctx, db, now.Add(-time.Minute), "paused", "off", "gone")
	until := now.Add(time.Hour).UTC().Truncate(time.Second)
	if err := db.PauseTarget(ctx, "paused", until); err != nil {
		t.Fatal(err)
	}
	if err := db.DisableTarget(ctx, "off", "HTTP 410 Gone from the test", now); err != nil {
		t.Fatal(err)
	}
	db.Close()

	stop := e.serveWithDashboard()
	defer stop()
	b := newBrowser(t, "http://"+addr)
	b.open(fmt.Sprintf("/ui/deliveries/%d", ids["paused"]))
	b.waitLocation("/ui/login")
	b.do("sign in", chromedp.SendKeys(chromedp.CSS("#token"), uiToken), chromedp.Click(chromedp.CSS("#sign-in")))
	b.waitLocation(fmt.Sprintf("/ui/deliveries/%d", ids["paused"]))

	want := map[string]string{
		"paused": until.Format("2006-01-02 15:04:05") + " UTC",
		"off":    "when its target is enabled",
		"gone":   "never",
	}
	// What a row says after "Next attempt", shown or folded.
	nextOf := func(id int64) string {
		return get(b, "read the next attempt", chromedp.Evaluate[string](fmt.Sprintf(`(() => {
			const dt = [...document.querySelectorAll("#delivery-%d dt")].find(e => e.textContent.trim() === "Next attempt");
			return dt ? dt.nextElementSibling.textContent : "";
		})()`, id)))
	}
	for _, target := range []string{"paused", "off", "gone"} {
		b.open(fmt.Sprintf("/ui/deliveries/%d", ids[target]))
		got := nextOf(ids[target])
		if !strings.Contains(got, want[target]) || strings.Contains(got, "ago") {
			t.Errorf("delivery of %s: next attempt %q, want it to say %q", target, got, want[target])
		}
	}
	b.open("/ui/deliveries?target=paused")
	if got := nextOf(ids["paused"]); !strings.Contains(got, want["paused"]) {
		t.Errorf("the log gives the paused target's row the next attempt %q, want %q", got, want["paused"])
	}
	if s, err := store.Open(ctx, e.db, store.Options{}); err == nil {
		defer s.Close()
		for target, id := range ids {
			if r, ok, err := s.Delivery(ctx, id); err != nil || !ok || r.Status != "pending" || r.Attempts != 0 {
				t.Errorf("delivery of %s: %+v, %v, %v; want it pending, never attempted", target, r, ok, err)
			}
		}
	}
}

// deliveries list says, on stderr, when --limit cut the list short (the
// operator would otherwise take the newest 100 dead letters for all of
// them), and refuses a --limit that is not a number of rows.
func TestDeliveriesListSaysWhenItIsCut(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	ctx := context.Background()
	db := e.openStore()
	for i := range 3 {
		if _, err := db.Enqueue(ctx, "crm", fmt.Sprintf("evt_cut_%d", i), "proxy", []byte(`{"n":1}`), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	const note = "only the newest 2 shown"
	code, stdout, stderr := e.run(ctx, "deliveries", "list", "--limit", "2")
	if code != exitOK || strings.Count(stdout, "evt_cut_") != 2 || !strings.Contains(stderr, note) {
		t.Errorf("list --limit 2 of 3: exit %d, does not show 2 and say there are more\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = e.run(ctx, "deliveries", "list", "--limit", "2", "--json")
	var rows []deliveryRow
	if err := jsonUnmarshal(stdout, &rows); code != exitOK || err != nil || len(rows) != 2 || !strings.Contains(stderr, note) {
		t.Errorf("list --limit 2 --json of 3: exit %d, %v, %d rows\n%s%s", code, err, len(rows), stdout, stderr)
	}
	code, stdout, stderr = e.run(ctx, "deliveries", "list", "--limit", "3")
	if code != exitOK || strings.Count(stdout, "evt_cut_") != 3 || strings.Contains(stderr, "only the newest") {
		t.Errorf("list --limit 3 of 3: exit %d, says the list was cut or lacks a row\n%s%s", code, stdout, stderr)
	}
	if code, _, stderr := e.run(ctx, "deliveries", "list", "--limit", "0"); code != exitUsage || !strings.Contains(stderr, "--limit") {
		t.Errorf("list --limit 0: exit %d, want %d and a word on --limit\n%s", code, exitUsage, stderr)
	}
}

// deliveries redirect shows the URL as attempts do, without the token in
// its query or its password, and refuses clearly a delivery whose target is
// no longer configured (its secret and settings are gone).
func TestDeliveriesRedirectHidesTheURLsSecrets(t *testing.T) {
	insp := newRecorder()
	srv := httptest.NewServer(insp)
	defer srv.Close()
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeDeliveryConfig(freeAddr(t), srv.URL)
	ctx := context.Background()
	db := e.openStore()
	id, err := db.Enqueue(ctx, "recorder", "evt_redirect", "proxy", []byte(`{"n":1}`), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	gone, err := db.Enqueue(ctx, "removed", "evt_removed", "proxy", []byte(`{"n":1}`), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	const secret = "s3cr3t-inspector-token"
	for _, u := range []string{srv.URL + "/in?token=" + secret, strings.Replace(srv.URL, "http://", "http://user:"+secret+"@", 1) + "/in"} {
		code, stdout, stderr := e.run(ctx, "deliveries", "redirect", fmt.Sprint(id), u)
		if code != exitOK || !strings.Contains(stdout, "200") {
			t.Errorf("redirect to %s: exit %d\n%s%s", srv.URL, code, stdout, stderr)
		}
		if strings.Contains(stdout+stderr, secret) {
			t.Errorf("redirect prints the URL's secret:\n%s%s", stdout, stderr)
		}
	}
	if d, total := insp.counts(); d != 1 || total != 2 {
		t.Errorf("the inspector got %d requests of %d events, want 2 of 1", total, d)
	}
	code, stdout, stderr := e.run(ctx, "deliveries", "redirect", fmt.Sprint(gone), srv.URL+"/in")
	if code != exitUsage || !strings.Contains(stderr, `"removed", which is not in the configuration`) {
		t.Errorf("redirect of a removed target's delivery: exit %d, want %d and why\n%s%s", code, exitUsage, stdout, stderr)
	}
}

// The dashboard's Redirect, as a script uses it: a URL the SSRF guard
// refuses is answered 422 saying why once ("refused: refused: …" before),
// and a delivery of a target no longer configured 409 saying why (a 500
// "internal" error naming an "unknown target" before).
func TestDashboardRedirectSaysWhyItRefuses(t *testing.T) {
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeServeConfig(addr, `targets:
  - {name: billing, url: "http://billing.invalid/hook"}
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`)
	ctx := context.Background()
	db := e.openStore()
	ids := enqueueEach(t, ctx, db, time.Now(), "billing", "removed")
	// Keep billing's row from being attempted meanwhile.
	if err := db.DisableTarget(ctx, "billing", "held by the test", time.Now()); err != nil {
		t.Fatal(err)
	}
	db.Close()
	stop := e.serveWithDashboard()
	defer stop()
	redirect := func(id int64, to string) (int, string) {
		t.Helper()
		return dashboardPost(t, addr, fmt.Sprintf("/ui/deliveries/%d/redirect", id), url.Values{"url": {to}})
	}
	code, body := redirect(ids["billing"], "http://127.0.0.1:9/inspect")
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, "refused: 127.0.0.1 is a loopback address") ||
		strings.Count(body, "refused") != 1 {
		t.Errorf("redirect to loopback: %d %s; want 422 saying once that it is refused and why", code, body)
	}
	code, body = redirect(ids["removed"], "http://inspector.invalid/in")
	if code != http.StatusConflict || !strings.Contains(body, "removed, which is not in the configuration") {
		t.Errorf("redirect of a removed target's delivery: %d %s; want 409 saying why", code, body)
	}
	// A redirect that reaches no one failed: it was answered 200, and a
	// script could not tell it from one delivered.
	code, body = redirect(ids["billing"], "http://inspector.invalid/in")
	if code != http.StatusBadGateway || !strings.Contains(body, "could not be sent to http://inspector.invalid/in") ||
		!strings.Contains(body, `"code":"bad_gateway"`) {
		t.Errorf("redirect to an address that does not resolve: %d %s; want 502 saying it could not be sent", code, body)
	}
}

// dashboardPost posts form to the dashboard's path on serve at addr,
// signed in with the dashboard token, and returns the answer's status code
// and body.
func dashboardPost(t *testing.T, addr, path string, form url.Values) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+uiToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// enqueueDeadLetter queues eventID for target, enqueued at at, and records
// its first attempt, to targetURL, answered status: the delivery is then a
// dead letter. It returns the delivery's id.
func enqueueDeadLetter(t *testing.T, ctx context.Context, db *store.DB, target, eventID, targetURL string, status int, at time.Time) int64 {
	t.Helper()
	id, err := db.Enqueue(ctx, target, eventID, "proxy", []byte(`{"n":1}`), at)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.RecordAttempt(ctx, store.Attempt{DeliveryID: id, Target: target, URL: targetURL, Attempt: 1,
		StatusCode: status, RequestID: "req", At: at}, store.Outcome{Status: store.StatusDeadLetter, Failures: 1}); err != nil {
		t.Fatal(err)
	}
	return id
}

// Retrying a delivery (or a target's dead letters) of a target a 410
// disabled, or that a 429 paused, says that it is not sent at once: from the
// CLI, and from the dashboard, which said "its next attempt is made within
// a second or so" while nothing would be sent until the target was enabled.
func TestRetrySaysWhenATargetHoldsItBack(t *testing.T) {
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeServeConfig(addr, `targets:
  - {name: crm, url: "http://crm.invalid/hook"}
  - {name: discord, url: "http://discord.invalid/hook"}
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`)
	ctx := context.Background()
	db := e.openStore()
	now := time.Now()
	dead := map[string][]int64{}
	for _, target := range []string{"crm", "crm", "crm", "discord", "discord"} {
		id := enqueueDeadLetter(t, ctx, db, target, fmt.Sprintf("evt_%s_%d", target, len(dead[target])), "http://x.invalid/hook", 410, now)
		dead[target] = append(dead[target], id)
	}
	if err := db.DisableTarget(ctx, "crm", "HTTP 410 Gone from the test", now); err != nil {
		t.Fatal(err)
	}
	until := now.Add(time.Hour).UTC().Truncate(time.Second)
	if err := db.PauseTarget(ctx, "discord", until); err != nil {
		t.Fatal(err)
	}
	db.Close()

	const enable = "backstop deliveries targets enable crm"
	code, stdout, stderr := e.run(ctx, "deliveries", "retry", fmt.Sprint(dead["crm"][0]))
	if code != exitOK || !strings.Contains(stdout, "queued again") || !strings.Contains(stdout, enable) {
		t.Errorf("retry of a disabled target's delivery: exit %d, does not say it waits for %q\n%s%s", code, enable, stdout, stderr)
	}
	code, stdout, stderr = e.run(ctx, "deliveries", "retry", fmt.Sprint(dead["discord"][0]))
	if code != exitOK || !strings.Contains(stdout, "paused until "+until.Format(time.RFC3339)) {
		t.Errorf("retry of a paused target's delivery: exit %d, does not give the pause's end\n%s%s", code, stdout, stderr)
	}

	stop := e.serveWithDashboard()
	defer stop()
	code, body := dashboardPost(t, addr, fmt.Sprintf("/ui/deliveries/%d/retry", dead["crm"][1]), nil)
	if code != http.StatusOK || !strings.Contains(body, enable) || strings.Contains(body, "within a second") {
		t.Errorf("dashboard Retry of a disabled target's delivery: %d %s; want it to say it waits for %q", code, body, enable)
	}
	code, body = dashboardPost(t, addr, "/ui/targets/crm/retry-dead", nil)
	if code != http.StatusOK || !strings.Contains(body, enable) {
		t.Errorf("dashboard retry-all of a disabled target: %d %s; want it to say it waits for %q", code, body, enable)
	}
	code, body = dashboardPost(t, addr, "/ui/targets/discord/retry-dead", nil)
	if code != http.StatusOK || !strings.Contains(body, "paused until") || strings.Contains(body, "within a second") {
		t.Errorf("dashboard retry-all of a paused target: %d %s; want it to give the pause's end", code, body)
	}
}

// An attempt the target does not answer within its timeout is logged as
// such, with the timeout, not as "context deadline exceeded".
func TestATimedOutAttemptSaysSo(t *testing.T) {
	answered := make(chan struct{})
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // longer than the target's 1 s timeout
		case <-answered:
		case <-time.After(3 * time.Second):
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer target.Close()
	defer close(answered)
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeDeliveryConfig(addr, target.URL)
	serveInProcess(t, e, addr)
	proxyPost(t, addr, "evt_timeout", `{"n":1}`)
	var shown string
	waitFor(t, time.Minute, func() bool {
		_, shown, _ = e.run(context.Background(), "deliveries", "show", "1")
		return strings.Contains(shown, "error:")
	})
	if !strings.Contains(shown, "error: timeout: no answer within 1s") || strings.Contains(shown, "context deadline exceeded") {
		t.Errorf("a timed-out attempt is not shown as a timeout:\n%s", shown)
	}
}

// deliveries list shows, without --since, the dead letters and queued rows
// older than 14 days: they are kept until retried or purged (or, queued
// for a disabled target, until it is enabled), and deliveries targets
// counts them, so a list that hid them lost them from sight.
func TestDeliveriesListShowsOldDeadLetters(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeDeliveryConfig(freeAddr(t), "http://127.0.0.1:9/hook")
	ctx := context.Background()
	db := e.openStore()
	old := time.Now().Add(-20 * 24 * time.Hour)
	enqueueDeadLetter(t, ctx, db, "recorder", "evt_old_dead", "http://127.0.0.1:9/hook", 400, old)
	if _, err := db.Enqueue(ctx, "recorder", "evt_old_queued", "proxy", []byte(`{"n":1}`), old); err != nil {
		t.Fatal(err)
	}
	db.Close()
	code, stdout, stderr := e.run(ctx, "deliveries", "list", "--status", "dead_letter")
	if code != exitOK || !strings.Contains(stdout, "evt_old_dead") {
		t.Errorf("list --status dead_letter: exit %d, hides a 20-day-old dead letter\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = e.run(ctx, "deliveries", "list")
	if code != exitOK || !strings.Contains(stdout, "evt_old_dead") || !strings.Contains(stdout, "evt_old_queued") {
		t.Errorf("list: exit %d, hides 20-day-old rows that are kept\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = e.run(ctx, "deliveries", "list", "--since", "14d")
	if code != exitOK || strings.Contains(stdout, "evt_old_") {
		t.Errorf("list --since 14d: exit %d, shows rows older than that\n%s%s", code, stdout, stderr)
	}
}

// The dashboard's Redirect to a URL that does not answer in time answers
// the browser that it timed out (the attempt is logged as a timeout),
// instead of leaving it with no answer at all once serve's 30 s write
// timeout cut the connection while the target's own 30 s timeout ran.
func TestDashboardRedirectToASlowURLAnswers(t *testing.T) {
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // so that the server sees the client hang up
		select {                    // never answers; the client gives up
		case <-r.Context().Done():
		case <-time.After(time.Minute):
		}
	}))
	defer slow.Close()
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeServeConfig(addr, `targets:
  - {name: billing, url: "http://127.0.0.1:9/hook", allow_private: true}
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`)
	ctx := context.Background()
	db := e.openStore()
	id, err := db.Enqueue(ctx, "billing", "evt_slow", "proxy", []byte(`{"n":1}`), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := db.DisableTarget(ctx, "billing", "held by the test", time.Now()); err != nil {
		t.Fatal(err)
	}
	db.Close()
	stop := e.serveWithDashboard()
	defer stop()
	req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("http://%s/ui/deliveries/%d/redirect", addr, id),
		strings.NewReader(url.Values{"url": {slow.URL + "/in"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+uiToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("the dashboard gave no answer to a Redirect to a URL that never answers: %v", err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || res.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "timeout") {
		t.Errorf("Redirect to a URL that never answers: %d %s %v; want 502 saying it timed out", res.StatusCode, body, err)
	}
	if _, shown, _ := e.run(ctx, "deliveries", "show", fmt.Sprint(id)); !strings.Contains(shown, "(redirect)") || !strings.Contains(shown, "error: timeout") {
		t.Errorf("the timed-out redirect is not logged as a timeout:\n%s", shown)
	}
}

// deliveries retry ID --target T (without --dead) is refused rather than
// retrying delivery ID, whatever its target, while --target is ignored.
func TestDeliveriesRetryRefusesTargetWithoutDead(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeDeliveryConfig(freeAddr(t), "http://127.0.0.1:9/hook")
	ctx := context.Background()
	db := e.openStore()
	id := enqueueDeadLetter(t, ctx, db, "recorder", "evt_dead", "http://127.0.0.1:9/hook", 400, time.Now())
	db.Close()
	code, stdout, stderr := e.run(ctx, "deliveries", "retry", fmt.Sprint(id), "--target", "billing")
	if code != exitUsage || !strings.Contains(stderr, "--target goes with --dead") {
		t.Errorf("retry ID --target: exit %d, want %d and why\n%s%s", code, exitUsage, stdout, stderr)
	}
	db = e.openStore()
	defer db.Close()
	if r, _, err := db.Delivery(ctx, id); err != nil || r.Status != store.StatusDeadLetter {
		t.Errorf("retry ID --target changed the delivery: %+v, %v", r, err)
	}
}

// deliveries targets --json speaks the snake_case of deliveries list
// --json, and gives a pause or a disabling only while there is one (not
// "PausedUntil": "0001-01-01T00:00:00Z" for every target never paused).
func TestDeliveriesTargetsJSON(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeServeConfig(freeAddr(t), `targets:
  - {name: crm, url: "http://crm.invalid/hook"}
  - {name: discord, url: "http://discord.invalid/hook"}
  - {name: billing, url: "http://billing.invalid/hook"}
`)
	ctx := context.Background()
	db := e.openStore()
	now := time.Now()
	if _, err := db.Enqueue(ctx, "crm", "evt_1", "proxy", []byte(`{"n":1}`), now); err != nil {
		t.Fatal(err)
	}
	if err := db.DisableTarget(ctx, "crm", "HTTP 410 Gone from the test", now); err != nil {
		t.Fatal(err)
	}
	until := now.Add(time.Hour).UTC().Truncate(time.Second)
	if err := db.PauseTarget(ctx, "discord", until); err != nil {
		t.Fatal(err)
	}
	db.Close()
	code, stdout, stderr := e.run(ctx, "deliveries", "targets", "--json")
	if code != exitOK {
		t.Fatalf("targets --json: exit %d\n%s", code, stderr)
	}
	var rows []map[string]any
	if err := jsonUnmarshal(stdout, &rows); err != nil || len(rows) != 3 {
		t.Fatalf("targets --json: %v\n%s", err, stdout)
	}
	want := []string{
		`map[configured:true dead_letter:0 delivered:0 disabled:true disabled_at:` + now.UTC().Format(time.RFC3339Nano) +
			` disabled_reason:HTTP 410 Gone from the test name:crm pending:1 retrying:0]`,
		`map[configured:true dead_letter:0 delivered:0 disabled:false name:discord paused_until:` + until.Format(time.RFC3339) + ` pending:0 retrying:0]`,
		`map[configured:true dead_letter:0 delivered:0 disabled:false name:billing pending:0 retrying:0]`,
	}
	for i, r := range rows {
		if got := fmt.Sprint(r); got != want[i] {
			t.Errorf("targets --json row %d:\n got %s\nwant %s", i, got, want[i])
		}
	}
}

// deliveries retry --help does not promise a send "within its poll
// interval" for a target a 410 disabled: it says how to enable it.
func TestDeliveriesRetryHelpNamesEnable(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	code, stdout, stderr := e.run(context.Background(), "deliveries", "retry", "--help")
	if code != exitOK || !strings.Contains(stdout, "deliveries targets enable NAME") {
		t.Errorf("retry --help: exit %d, does not say a disabled target holds deliveries back\n%s%s", code, stdout, stderr)
	}
}

// deliveries show of a dead letter whose attempts maintenance pruned (after
// 14 days) said "none yet" under attempts, beside ATTEMPTS 1. It now says
// the log was pruned and gives the last answer kept with the delivery.
func TestDeliveriesShowSaysWhenItsAttemptsWerePruned(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.appendConfig("targets:\n  - {name: crm, url: \"https://crm.example.com/hooks\"}\n")
	ctx := context.Background()
	db := e.openStore()
	old := time.Now().Add(-20 * 24 * time.Hour)
	id, err := db.Enqueue(ctx, "crm", "evt_old", "proxy", []byte(`{"n":1}`), old)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.RecordAttempt(ctx, store.Attempt{DeliveryID: id, Target: "crm", URL: "https://crm.example.com/hooks", Attempt: 1, StatusCode: 404, At: old},
		store.Outcome{Status: store.StatusDeadLetter}); err != nil {
		t.Fatal(err)
	}
	if n, err := db.PruneAttempts(ctx, time.Now().Add(-14*24*time.Hour)); err != nil || n != 1 {
		t.Fatalf("PruneAttempts = %d, %v; want the one attempt pruned", n, err)
	}
	db.Close()
	code, stdout, stderr := e.run(ctx, "deliveries", "show", strconv.FormatInt(id, 10))
	if code != exitOK {
		t.Fatalf("deliveries show: exit %d\n%s", code, stderr)
	}
	if want := "none kept: the log of its attempt was pruned (attempts are kept 14 days); its last answer: 404"; !strings.Contains(stdout, want) || strings.Contains(stdout, "none yet") {
		t.Errorf("deliveries show of a dead letter with its attempts pruned:\n%s\nwant %q", stdout, want)
	}
}

// `deliveries targets enable` lifts a 429's pause in a running serve too,
// not only the pause stored for the target: the delivery a 429 with
// Retry-After: 60 answered goes out within seconds of the enable, not a
// minute later.
func TestTargetsEnableLiftsARunningServesPause(t *testing.T) {
	var requests atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 1 {
			w.Header().Set("Retry-After", "60")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer target.Close()
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeDeliveryConfig(addr, target.URL)
	serveInProcess(t, e, addr)
	proxyPost(t, addr, "evt_paused", `{"n":1}`)
	waitFor(t, time.Minute, func() bool {
		_, out, _ := e.run(context.Background(), "deliveries", "targets", "--json")
		return strings.Contains(out, `"paused_until"`)
	})
	if code, out, errOut := e.run(context.Background(), "deliveries", "targets", "enable", "recorder"); code != exitOK {
		t.Fatalf("targets enable: exit %d\n%s%s", code, out, errOut)
	}
	enabled := time.Now()
	var shown string
	waitFor(t, time.Minute, func() bool {
		_, shown, _ = e.run(context.Background(), "deliveries", "show", "1")
		return strings.Contains(shown, "status delivered")
	})
	if took := time.Since(enabled); took > 10*time.Second {
		t.Errorf("delivered %v after targets enable; want within seconds (the 429 asked for 60 s)\n%s", took.Round(time.Second), shown)
	}
}
