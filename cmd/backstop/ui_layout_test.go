package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// A long last answer ("refused: 127.0.0.1 is a loopback address") stays
// inside its column of the delivery log, cut with an ellipsis, with the
// full text in its title; it neither covers the Queued column nor runs
// past the card.
func TestDashboardCutsALongLastAnswer(t *testing.T) {
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeServeConfig(addr, `targets:
  - {name: billing, url: "http://127.0.0.1:9/hooks", events: ["payment.*"], allow_private: true}
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`)
	const refusal = "refused: 127.0.0.1 is a loopback address (set allow_private on the target to allow it)"
	ctx := context.Background()
	db := e.openStore()
	now := time.Now()
	id, err := db.Enqueue(ctx, "billing", "evt_long", "payment.failed", json.RawMessage(`{"event_id":"evt_long"}`), now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.RecordAttempt(ctx, store.Attempt{DeliveryID: id, Target: "billing", URL: "http://127.0.0.1:9/hooks", Attempt: 1,
		Error: refusal, RequestID: "req-long", At: now}, store.Outcome{Status: store.StatusDeadLetter}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	stop := e.serveWithDashboard()
	defer stop()
	b := newBrowser(t, "http://"+addr)
	b.open("/ui/login?next=/ui/deliveries")
	b.do("sign in", chromedp.SendKeys(chromedp.CSS("#token"), uiToken), chromedp.Click(chromedp.CSS("#sign-in")))
	b.waitLocation("/ui/deliveries")
	b.shot("long-last-answer")

	row := fmt.Sprintf("#delivery-%d > summary", id)
	// Right edges, in CSS pixels, of the answer's text, its column, the
	// Queued column's left edge and the card's right edge.
	geometry := get(b, "measure the row", chromedp.Evaluate[map[string]float64](fmt.Sprintf(`(() => {
		const row = document.querySelector(%q);
		const last = row.querySelector(".c-last"), text = last.firstElementChild;
		return {
			text: text.getBoundingClientRect().right, textScroll: text.scrollWidth, textClient: text.clientWidth,
			cell: last.getBoundingClientRect().right,
			queued: row.querySelector(".c-time").getBoundingClientRect().left,
			card: document.querySelector("#log").getBoundingClientRect().right,
			page: document.documentElement.scrollWidth, view: document.documentElement.clientWidth,
		};
	})()`, row)))
	t.Logf("geometry: %v", geometry)
	if geometry["text"] > geometry["cell"]+0.5 || geometry["text"] > geometry["queued"] {
		t.Errorf("the last answer runs to x=%.0f, past its column (ends at %.0f; Queued starts at %.0f)",
			geometry["text"], geometry["cell"], geometry["queued"])
	}
	if geometry["cell"] > geometry["card"] || geometry["page"] > geometry["view"] {
		t.Errorf("the row runs past the card (%.0f > %.0f) or the page scrolls sideways (%.0f > %.0f)",
			geometry["cell"], geometry["card"], geometry["page"], geometry["view"])
	}
	if geometry["textScroll"] <= geometry["textClient"] {
		t.Errorf("the last answer is not cut (scroll width %.0f, width %.0f): the test's text should be longer than the column",
			geometry["textScroll"], geometry["textClient"])
	}
	title := get(b, "read the title", chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).querySelector(".c-last").firstElementChild.title`, row)))
	if title != refusal {
		t.Errorf("the cut answer's title is %q, want the full text %q", title, refusal)
	}
	if overflow := get(b, "read the ellipsis", chromedp.Evaluate[string](fmt.Sprintf(
		`getComputedStyle(document.querySelector(%q).querySelector(".c-last").firstElementChild).textOverflow`, row))); !strings.Contains(overflow, "ellipsis") {
		t.Errorf("the cut answer's text-overflow is %q, want ellipsis", overflow)
	}
}
