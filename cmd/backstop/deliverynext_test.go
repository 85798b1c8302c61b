package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// deliveries list and show say when a queued row is really attempted: at
// the end of its target's pause when that is later than the row's own
// time, and not at all while the target is disabled or not configured.
func TestDeliveriesSayWhenAQueuedRowIsSent(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	base, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	e.writeConfig(string(base) + `targets:
  - {name: paused, url: "http://127.0.0.1:9/hook", allow_private: true}
  - {name: off, url: "http://127.0.0.1:9/hook", allow_private: true}
  - {name: held, url: "http://127.0.0.1:9/hook", allow_private: true}
`)
	ctx := context.Background()
	db := e.openStore()
	now := time.Now()
	ids := enqueueEach(t, ctx, db, now, "paused", "off", "gone", "held")
	until := now.Add(time.Hour).UTC().Truncate(time.Second)
	if err := db.PauseTarget(ctx, "paused", until); err != nil {
		t.Fatal(err)
	}
	if err := db.DisableTarget(ctx, "off", "410 from the test", now); err != nil {
		t.Fatal(err)
	}
	// A row answered 429 is held under its claim (its own time the claim's
	// end) until its target's shorter pause ends.
	if _, err := db.RecordAttempt(ctx, store.Attempt{DeliveryID: ids["held"], Target: "held", URL: "http://127.0.0.1:9/hook",
		Attempt: 1, StatusCode: 429, RequestID: "req_1", At: now},
		store.Outcome{Status: "retrying", NextAttemptAt: now.Add(70 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	heldUntil := now.Add(10 * time.Second).UTC().Truncate(time.Second)
	if err := db.PauseTarget(ctx, "held", heldUntil); err != nil {
		t.Fatal(err)
	}
	db.Close()

	code, stdout, stderr := e.run(ctx, "deliveries", "list")
	if code != exitOK {
		t.Fatalf("list: exit %d\n%s", code, stderr)
	}
	for _, want := range []string{until.Format(time.RFC3339) + " (target paused)", "when its target is enabled", "never (target not configured)",
		heldUntil.Format(time.RFC3339) + " (target paused)"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("list does not say %q:\n%s", want, stdout)
		}
	}
	code, stdout, stderr = e.run(ctx, "deliveries", "list", "--json")
	if code != exitOK {
		t.Fatalf("list --json: exit %d\n%s", code, stderr)
	}
	var rows []struct {
		Target              string     `json:"target"`
		TargetPausedUntil   *time.Time `json:"target_paused_until"`
		TargetDisabled      bool       `json:"target_disabled"`
		TargetNotConfigured bool       `json:"target_not_configured"`
	}
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil || len(rows) != 4 {
		t.Fatalf("list --json: %v\n%s", err, stdout)
	}
	for _, r := range rows {
		ok := false
		switch r.Target {
		case "paused":
			ok = r.TargetPausedUntil != nil && r.TargetPausedUntil.Equal(until) && !r.TargetDisabled && !r.TargetNotConfigured
		case "off":
			ok = r.TargetPausedUntil == nil && r.TargetDisabled && !r.TargetNotConfigured
		case "gone":
			ok = r.TargetNotConfigured
		case "held":
			ok = r.TargetPausedUntil != nil && r.TargetPausedUntil.Equal(heldUntil)
		}
		if !ok {
			t.Errorf("--json row of %s: %+v", r.Target, r)
		}
	}
	code, stdout, stderr = e.run(ctx, "deliveries", "show", strconv.FormatInt(ids["paused"], 10))
	if code != exitOK || !strings.Contains(stdout, "next attempt "+until.Format(time.RFC3339)+" (target paused)") {
		t.Errorf("show: exit %d, does not give the pause's end\n%s%s", code, stdout, stderr)
	}
}

// deliveries --json keeps the target's answer apart from our errors: a
// 500 whose body was "ok" read as `"last_error": "ok"`.
func TestDeliveriesJSONTellsAnAnswerFromAnError(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.appendConfig(`targets:
  - {name: answered, url: "https://crm.example.com/hooks"}
  - {name: silent, url: "https://crm.example.com/hooks"}
`)
	ctx := context.Background()
	now := time.Now()
	db := e.openStore()
	ids := enqueueEach(t, ctx, db, now, "answered", "silent")
	for target, a := range map[string]store.Attempt{
		"answered": {StatusCode: 500, Body: "ok"},
		"silent":   {Error: "dial tcp: connection refused"},
	} {
		a.DeliveryID, a.Target, a.URL, a.Attempt, a.RequestID, a.At = ids[target], target, "https://crm.example.com/hooks", 1, "req_1", now
		if _, err := db.RecordAttempt(ctx, a, store.Outcome{Status: "retrying", NextAttemptAt: now.Add(time.Minute), Failures: 1}); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	code, stdout, stderr := e.run(ctx, "deliveries", "list", "--json")
	if code != exitOK {
		t.Fatalf("list --json: exit %d\n%s", code, stderr)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil || len(rows) != 2 {
		t.Fatalf("list --json: %v\n%s", err, stdout)
	}
	for _, r := range rows {
		switch r["target"] {
		case "answered":
			if r["last_status"] != float64(500) || r["last_response"] != "ok" || r["last_error"] != nil {
				t.Errorf("a 500 answered ok: %v; want last_status 500, last_response ok, no last_error", r)
			}
		case "silent":
			if r["last_status"] != nil || r["last_response"] != nil || r["last_error"] != "dial tcp: connection refused" {
				t.Errorf("no answer: %v; want last_error only", r)
			}
		}
	}
}

// deliveries show says what a target whose max_payload cuts a payload is
// really sent: it showed the whole payload as stored, as if sent.
func TestDeliveriesShowSaysWhatIsSentWhenCut(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.appendConfig(`targets:
  - {name: small, url: "https://small.example.com/hooks", max_payload: 300}
  - {name: big, url: "https://big.example.com/hooks"}
`)
	ctx := context.Background()
	data := `{"id":"pay_1","pad":"` + strings.Repeat("x", 1000) + `"}`
	db := e.openStore()
	ev := backstop.Event{ID: "evt_1", Type: "note.created", Origin: backstop.OriginWebhook, Data: json.RawMessage(data),
		CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	if _, err := db.Emit(ctx, []backstop.Event{ev}, []backstop.Route{{Target: "small", Events: []string{"*"}}, {Target: "big", Events: []string{"*"}}}); err != nil {
		t.Fatal(err)
	}
	ids := map[string]int64{}
	for _, target := range []string{"small", "big"} {
		rows, err := db.OutboxRows(ctx, target)
		if err != nil || len(rows) != 1 {
			t.Fatalf("%s's outbox: %+v %v", target, rows, err)
		}
		ids[target] = rows[0].ID
	}
	small, big := ids["small"], ids["big"]
	db.Close()
	code, stdout, stderr := e.run(ctx, "deliveries", "show", fmt.Sprint(small))
	if code != exitOK || !strings.Contains(stdout, "sent to small cut to fit its max_payload of 300 bytes (the payload is 1129)") ||
		!strings.Contains(stdout, `"truncated": true`) {
		t.Errorf("show %d: exit %d\n%s%s", small, code, stdout, stderr)
	}
	code, stdout, _ = e.run(ctx, "deliveries", "show", fmt.Sprint(small), "--json")
	var shown struct {
		Sent map[string]any `json:"sent_payload"`
	}
	if code != exitOK || json.Unmarshal([]byte(stdout), &shown) != nil || shown.Sent["truncated"] != true ||
		fmt.Sprint(shown.Sent["data"]) != "map[id:pay_1]" {
		t.Errorf("show --json: exit %d, sent_payload %v\n%s", code, shown.Sent, stdout)
	}
	code, stdout, _ = e.run(ctx, "deliveries", "show", fmt.Sprint(big), "--json")
	if code != exitOK || strings.Contains(stdout, "sent_payload") {
		t.Errorf("show --json of one sent whole: exit %d, want no sent_payload\n%s", code, stdout)
	}
}
