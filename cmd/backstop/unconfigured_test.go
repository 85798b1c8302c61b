package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// Deliveries queued for targets a1 and a2, then a configuration with only
// a3: serve warns of them at start, deliveries targets and the dashboard
// list a1 and a2 as not in the configuration, retry of one of their
// deliveries is refused, and purge --target deletes them (refused for a3).
func TestDeliveriesOfTargetsNotInTheConfiguration(t *testing.T) {
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	ctx := context.Background()
	db := e.openStore()
	now := time.Now()
	deliver := func(target, eventID, status string) int64 {
		t.Helper()
		id, err := db.Enqueue(ctx, target, eventID, "payment.failed", json.RawMessage(`{"event_id":"`+eventID+`"}`), now)
		if err != nil {
			t.Fatal(err)
		}
		if status == store.StatusPending {
			return id
		}
		a := store.Attempt{DeliveryID: id, Target: target, URL: "http://" + target + ".invalid/", Attempt: 1, StatusCode: 503,
			RequestID: "req-" + eventID, At: now}
		if _, err := db.RecordAttempt(ctx, a, store.Outcome{Status: status, NextAttemptAt: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	deliver("a1", "evt_1", store.StatusPending)
	deliver("a1", "evt_2", store.StatusRetrying)
	dead := deliver("a1", "evt_3", store.StatusDeadLetter)
	deliver("a2", "evt_1", store.StatusRetrying)
	deliver("a4", "evt_1", store.StatusDelivered) // history only: nothing stranded
	db.Close()
	e.writeServeConfig(addr, `targets:
  - {name: a3, url: "http://127.0.0.1:9/hooks", allow_private: true}
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`)

	// serve warns at start, naming each target with its counts.
	t.Setenv("BACKSTOP_DASHBOARD_TOKEN", uiToken)
	stop := serveInProcess(t, e, addr)
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/ui/dead-letters", nil)
	req.Header.Set("Authorization", "Bearer "+uiToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, name := range []string{"a1", "a2", "a4"} {
		row := regexp.MustCompile(`(?s)<tr id="target-` + name + `">.*?</tr>`).FindString(string(page))
		if !strings.Contains(row, "not in the configuration") {
			t.Errorf("the dashboard's Targets table does not list %s as not in the configuration:\n%s", name, row)
		}
		if !strings.Contains(string(page), `<option value="`+name+`">`) {
			t.Errorf("the dashboard's target filter does not offer %s", name)
		}
	}
	stderr := stop()
	for _, want := range []string{
		`target a1 is not in the configuration but has 2 queued and 1 dead-letter deliveries, which are never sent: add it back to targets, or delete them with: backstop deliveries purge --target a1`,
		`target a2 is not in the configuration but has 1 queued and 0 dead-letter deliveries`,
	} {
		if !strings.Contains(stderr, want) || !strings.Contains(stderr, "level=WARN") {
			t.Errorf("serve did not warn %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "target a4") {
		t.Errorf("serve warned of a4, which has only delivered deliveries:\n%s", stderr)
	}

	// deliveries targets lists them, marked.
	code, out, errOut := e.run(ctx, "deliveries", "targets")
	if code != 0 {
		t.Fatalf("deliveries targets: exit %d\n%s", code, errOut)
	}
	if !regexp.MustCompile(`(?m)^a1 \(not in the configuration\)\s+1\s+1\s+0\s+1\s`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^a2 \(not in the configuration\)\s+0\s+1\s`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^a3\s+0\s+0\s+0\s+0\s`).MatchString(out) ||
		!strings.Contains(out, "backstop deliveries purge --target NAME") {
		t.Errorf("deliveries targets:\n%s", out)
	}
	code, out, errOut = e.run(ctx, "deliveries", "targets", "--json")
	var states []struct {
		Name                         string
		Configured                   bool
		Pending, Retrying, Delivered int
		DeadLetter                   int `json:"dead_letter"`
	}
	if err := json.Unmarshal([]byte(out), &states); code != 0 || err != nil {
		t.Fatalf("deliveries targets --json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	got := fmt.Sprint(states)
	if want := "[{a3 true 0 0 0 0} {a1 false 1 1 0 1} {a2 false 0 1 0 0} {a4 false 0 0 1 0}]"; got != want {
		t.Errorf("deliveries targets --json = %s, want %s", got, want)
	}

	// retry of a delivery of a1 is refused: it would never be sent.
	code, out, errOut = e.run(ctx, "deliveries", "retry", fmt.Sprint(dead))
	if code != 2 || !strings.Contains(errOut, `target "a1", which is not in the configuration`) || strings.Contains(out, "queued again") {
		t.Errorf("retry %d: exit %d\n%s%s", dead, code, out, errOut)
	}
	if got := deliveryStatus(t, e.db, dead); got != store.StatusDeadLetter {
		t.Errorf("after the refused retry delivery %d is %s, want dead_letter", dead, got)
	}

	// purge --target: refused for a3, deletes a1's deliveries of every
	// status with their attempts.
	code, _, errOut = e.run(ctx, "deliveries", "purge", "--target", "a3")
	if code != 2 || !strings.Contains(errOut, `target "a3" is in the configuration`) {
		t.Errorf("purge --target a3: exit %d\n%s", code, errOut)
	}
	code, out, errOut = e.run(ctx, "deliveries", "purge", "--target", "a1")
	if code != 0 || !strings.Contains(out, "3 deliveries of a1") {
		t.Errorf("purge --target a1: exit %d\n%s%s", code, out, errOut)
	}
	db = e.openStore()
	defer db.Close()
	if _, ok, err := db.Delivery(ctx, dead); ok || err != nil {
		t.Errorf("delivery %d of a1 after the purge: ok %v, err %v", dead, ok, err)
	}
	if as, err := db.Attempts(ctx, dead); len(as) != 0 || err != nil {
		t.Errorf("delivery %d of a1 after the purge: %d attempts, err %v", dead, len(as), err)
	}
	_, out, _ = e.run(ctx, "deliveries", "targets")
	if strings.Contains(out, "a1") || !strings.Contains(out, "a2 (not in the configuration)") {
		t.Errorf("deliveries targets after purging a1:\n%s", out)
	}
	if code, out, _ := e.run(ctx, "deliveries", "purge", "--help"); code != 0 || !strings.Contains(out, "--target T deletes every delivery of T") {
		t.Errorf("purge --help does not document --target:\n%s", out)
	}
}
