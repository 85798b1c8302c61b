package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

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
