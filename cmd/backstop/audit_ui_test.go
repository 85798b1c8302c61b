package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// fitsWidth fails unless every element the selectors match ends inside
// the element inside (the card it belongs to) and the page does not
// scroll sideways.
func (b *browser) fitsWidth(what, inside string, sels ...string) {
	b.t.Helper()
	geometry := get(b, "measure "+what, chromedp.Evaluate[map[string]float64](fmt.Sprintf(`(() => {
		const out = {page: document.documentElement.scrollWidth, view: document.documentElement.clientWidth,
			card: document.querySelector(%q).getBoundingClientRect().right};
		for (const sel of %s) {
			for (const el of document.querySelectorAll(sel)) {
				out[sel] = Math.max(out[sel] || 0, el.getBoundingClientRect().right);
			}
		}
		return out;
	})()`, inside, jsStrings(sels))))
	if geometry["page"] > geometry["view"] {
		b.t.Errorf("%s: the page scrolls sideways (%.0f px wide in a %.0f px window): %v", what, geometry["page"], geometry["view"], geometry)
	}
	for _, sel := range sels {
		if right, ok := geometry[sel]; !ok {
			b.t.Errorf("%s: nothing matches %s", what, sel)
		} else if right > geometry["card"]+0.5 {
			b.t.Errorf("%s: %s runs to x=%.0f, past its card (ends at %.0f)", what, sel, right, geometry["card"])
		}
	}
}

// jsStrings writes ss as a JavaScript array of strings.
func jsStrings(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return "[" + strings.Join(q, ",") + "]"
}

// A payload queued through the webhook proxy with the longest key it takes
// (200 bytes, such as a chain of hashes) and a target answering with a
// long unbroken body: the expanded delivery keeps to its card, on the
// delivery's own page and in the log, instead of widening the page to
// several screens (the key, as Event id, did).
func TestDashboardExpandedRowKeepsLongValuesInItsCard(t *testing.T) {
	answer := strings.Repeat("e3b0c44298fc1c149afbf4c8996fb924", 20)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, answer)
	}))
	defer target.Close()
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeServeConfig(addr, fmt.Sprintf(`  proxy_token: proxy-secret-token
targets:
  - {name: billing, url: %q, allow_private: true}
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`, target.URL+"/hooks"))
	stop := e.serveWithDashboard()
	defer stop()

	key := strings.Repeat("9f86d081884c7d659a2feaa0c55ad015", 7)[:intake.MaxIDBytes]
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/outbox/billing", strings.NewReader(`{"order":42}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer proxy-secret-token")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusAccepted {
		t.Fatalf("POST /outbox/billing: %d %s", res.StatusCode, body)
	}
	const id = 1
	waitFor(t, stepTimeout, func() bool { return deliveryStatus(t, e.db, id) == store.StatusDeadLetter })

	b := newBrowser(t, "http://"+addr)
	b.open(fmt.Sprintf("/ui/login?next=/ui/deliveries/%d", id))
	b.do("sign in", chromedp.SendKeys(chromedp.CSS("#token"), uiToken), chromedp.Click(chromedp.CSS("#sign-in")))
	b.waitLocation(fmt.Sprintf("/ui/deliveries/%d", id))
	b.shot("long-key")
	if got := b.text(fmt.Sprintf("#delivery-%d dl.facts code", id)); got != key {
		t.Errorf("the delivery page shows the key %q, want %q", got, key)
	}
	row := fmt.Sprintf("#delivery-%d", id)
	b.fitsWidth("the delivery's page", row, row+" dl.facts dd", row+" table.attempts", row+" pre.body", row+" .actions")

	b.open("/ui/deliveries")
	b.do("expand the row", chromedp.Click(chromedp.CSS(row+" > summary")), chromedp.WaitVisible(chromedp.CSS(row+" .payload")))
	b.shot("long-key-log")
	b.fitsWidth("the log", "#log", row+" dl.facts dd", row+" table.attempts", row+" pre.body", row+" .actions")
}

// bearerPage fetches a dashboard page as a script does (bearer token,
// asking for HTML) and returns its body.
func bearerPage(t *testing.T, url string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+uiToken)
	req.Header.Set("Accept", "text/html")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v\n%.500s", url, res.StatusCode, err, body)
	}
	return string(body)
}

// A target that answers 429 with "Retry-After: 1" for an hour gives the
// delivery at the head of its queue an attempt a second (a 429 is not a
// failure, so it never dead-letters), each with its 4 KiB answer. The log
// lists such a delivery with its last attempts and says where the rest
// are, instead of writing every attempt of it into the page (2,000 made
// the first page of the log 9 MB); the delivery's own page lists them all.
func TestDashboardLogListsTheLastAttemptsOfARowAnsweredManyTimes(t *testing.T) {
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeServeConfig(addr, `targets:
  - {name: discord, url: "http://127.0.0.1:9/hooks", allow_private: true}
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`)
	const attempts = 2000
	ctx := context.Background()
	db := e.openStore()
	now := time.Now()
	stormed, err := db.Enqueue(ctx, "discord", "evt_storm", "proxy", json.RawMessage(`{"n":1}`), now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	answer := `{"message":"You are being rate limited.","retry_after":1}` + strings.Repeat(" ", store.MaxAttemptBody-60)
	items := make([]store.AttemptOutcome, attempts)
	for i := range items {
		at := now.Add(-time.Hour + time.Duration(i)*time.Second)
		items[i] = store.AttemptOutcome{
			Attempt: store.Attempt{DeliveryID: stormed, Target: "discord", URL: "http://127.0.0.1:9/hooks", Attempt: i + 1,
				StatusCode: http.StatusTooManyRequests, Body: answer, RequestID: fmt.Sprintf("req-storm-%d", i+1), At: at},
			Outcome: store.Outcome{Status: store.StatusRetrying, NextAttemptAt: now.Add(time.Hour)},
		}
	}
	if _, err := db.RecordAttempts(ctx, items); err != nil {
		t.Fatal(err)
	}
	quiet, err := db.Enqueue(ctx, "discord", "evt_quiet", "proxy", json.RawMessage(`{"n":2}`), now)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	stop := e.serveWithDashboard()
	defer stop()

	base := "http://" + addr
	log := bearerPage(t, base+"/ui/deliveries")
	t.Logf("the log's first page: %d bytes", len(log))
	if len(log) > 256<<10 {
		t.Errorf("the log's first page is %d KiB for two deliveries, want well under 256 KiB", len(log)>>10)
	}
	if !strings.Contains(log, fmt.Sprintf("delivery-%d", quiet)) {
		t.Errorf("the log lacks the other delivery %d", quiet)
	}

	b := newBrowser(t, base)
	b.open("/ui/login?next=/ui/deliveries")
	b.do("sign in", chromedp.SendKeys(chromedp.CSS("#token"), uiToken), chromedp.Click(chromedp.CSS("#sign-in")))
	b.waitLocation("/ui/deliveries")
	row := fmt.Sprintf("#delivery-%d", stormed)
	b.do("expand the row", chromedp.Click(chromedp.CSS(row+" > summary")), chromedp.WaitVisible(chromedp.CSS(row+" .payload")))
	b.shot("many-attempts-log")
	shown := get(b, "read the attempt numbers", chromedp.Evaluate[[]string](fmt.Sprintf(
		`[...document.querySelectorAll("%s tbody.attempt")].map(e => e.dataset.attempt)`, row)))
	if len(shown) == 0 || len(shown) > 20 || shown[len(shown)-1] != fmt.Sprint(attempts) {
		t.Errorf("the log's row lists attempts %v, want the last few, ending with %d", shown, attempts)
	}
	if note := b.text(row + " .earlier"); !strings.Contains(note, fmt.Sprint(attempts)) {
		t.Errorf("the row says %q, want how many attempts there are (%d) and where they are", note, attempts)
	}
	b.do("follow the link to the delivery's page", chromedp.Click(chromedp.CSS(row+" .earlier a")))
	b.waitLocation(fmt.Sprintf("/ui/deliveries/%d", stormed))
	// The form after the attempts: the whole list has been read.
	b.do("wait for the whole page", chromedp.WaitVisible(chromedp.CSS(row+" .actions")))
	if n := b.count(row + " tbody.attempt"); n != attempts {
		t.Errorf("the delivery's page lists %d attempts, want all %d", n, attempts)
	}
}

// A job longer than its interval stores a skipped run at every tick while
// it runs. The Jobs page's Last run says what `backstop jobs` says (the
// newest run that did run: here, one that failed), not "skipped", and its
// list of last runs holds that run even when more than ten skipped ones
// came after it.
func TestDashboardLastRunIsNotASkippedTick(t *testing.T) {
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeServeConfig(addr, `jobs:
  - {name: crm-sync, kind: sync, resources: [contacts], cron: "0 3 * * *"}
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`)
	ctx := context.Background()
	db := e.openStore()
	now := time.Now()
	if _, err := db.SaveJobRun(ctx, store.JobRun{Job: "crm-sync", Kind: "sync", StartedAt: now.Add(-30 * time.Minute),
		FinishedAt: now.Add(-16 * time.Minute), Status: "failed", Error: "contacts: platform answered 503 five times",
		Counts: backstop.JobCounts{Pages: 7, Objects: 1400, Requests: 12}}); err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		at := now.Add(-time.Duration(29-i) * time.Minute)
		if _, err := db.SaveJobRun(ctx, store.JobRun{Job: "crm-sync", Kind: "sync", StartedAt: at, FinishedAt: at, Status: "skipped"}); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	code, out, stderr := e.run(ctx, "jobs", "--json")
	if code != exitOK {
		t.Fatalf("jobs: exit %d\n%s", code, stderr)
	}
	var cli []jobRow
	if err := json.Unmarshal([]byte(out), &cli); err != nil || len(cli) != 1 || cli[0].LastRun == nil {
		t.Fatalf("jobs --json: %v\n%s", err, out)
	}
	if cli[0].LastRun.Status != "failed" {
		t.Fatalf("backstop jobs gives the last run as %s, want the run that failed before the skipped ticks", cli[0].LastRun.Status)
	}
	stop := e.serveWithDashboard()
	defer stop()

	b := newBrowser(t, "http://"+addr)
	b.open("/ui/login?next=/ui/jobs")
	b.do("sign in", chromedp.SendKeys(chromedp.CSS("#token"), uiToken), chromedp.Click(chromedp.CSS("#sign-in")))
	b.waitLocation("/ui/jobs")
	b.do("open the last runs", chromedp.Click(chromedp.CSS("#job-crm-sync .runs summary")))
	b.shot("jobs-skipped-ticks")
	if last := b.text("#job-crm-sync tr:first-child td:nth-child(6)"); !strings.HasPrefix(strings.TrimSpace(last), cli[0].LastRun.Status) {
		t.Errorf("the Jobs page's Last run is %q; backstop jobs says %s", last, cli[0].LastRun.Status)
	}
	runs := get(b, "read the last runs", chromedp.Evaluate[[]string](
		`[...document.querySelectorAll("#job-crm-sync .runs tbody tr")].map(tr => tr.cells[2].textContent.trim())`))
	if len(runs) == 0 || !strings.HasPrefix(runs[len(runs)-1], "failed") {
		t.Errorf("the job's last runs are %q, want the skipped ticks and then the failed run", runs)
	}
}
