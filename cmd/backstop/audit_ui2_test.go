package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

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
