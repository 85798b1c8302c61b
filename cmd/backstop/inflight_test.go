package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// A Retry of a delivery whose attempt is in flight, from the CLI or the
// dashboard, is refused and says why: requeueing it would have sent it a
// second time even though that attempt succeeds. The target holds the
// attempt until both retries were refused; then it is delivered, once.
func TestRetryWhileTheAttemptIsInFlight(t *testing.T) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	var mu stdsync.Mutex
	got := map[string]int{}
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Event-Id")
		mu.Lock()
		got[id]++
		first := id == "evt_held" && got[id] == 1
		mu.Unlock()
		if first {
			arrived <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer target.Close()
	let := stdsync.OnceFunc(func() { close(release) })
	defer let()

	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeServeConfig(addr, fmt.Sprintf(`  proxy_token: proxy-secret-token
targets:
  - name: recorder
    url: %s
    allow_private: true
    timeout: 1m
dashboard:
  token: ${BACKSTOP_DASHBOARD_TOKEN}
`, target.URL))
	stop := e.serveWithDashboard()
	defer stop()
	proxyPost(t, addr, "evt_held", `{"n":1}`)
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the attempt did not reach the target")
	}
	ctx := context.Background()
	db := e.openStore()
	defer db.Close()
	rows, err := db.Deliveries(ctx, store.DeliveryFilter{})
	if err != nil || len(rows) != 1 {
		t.Fatalf("deliveries: %v %v", rows, err)
	}
	id := rows[0].ID

	// show and list say it is being sent, not that its next attempt is
	// when its claim ends.
	code, stdout, stderr := e.run(ctx, "deliveries", "show", fmt.Sprint(id))
	if code != exitOK || !strings.Contains(stdout, "next attempt now: claimed for sending until") {
		t.Errorf("show while the attempt is in flight: exit %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = e.run(ctx, "deliveries", "list", "--json")
	var listed []deliveryRow
	if code != exitOK || jsonUnmarshal(stdout, &listed) != nil || len(listed) != 1 || listed[0].ClaimedUntil == nil {
		t.Errorf("list --json while the attempt is in flight: exit %d, want claimed_until\n%s%s", code, stdout, stderr)
	}

	if page := bearerPage(t, fmt.Sprintf("http://%s/ui/deliveries/%d", addr, id)); !strings.Contains(page, "being sent: claimed until") {
		t.Errorf("the dashboard's page of the delivery in flight does not say it is being sent:\n%.2000s", page)
	}

	code, stdout, stderr = e.run(ctx, "deliveries", "retry", fmt.Sprint(id))
	if code == exitOK || !strings.Contains(stderr, "claimed for sending to recorder") {
		t.Errorf("CLI retry while the attempt is in flight: exit %d\n%s%s\nwant refused, saying why", code, stdout, stderr)
	}
	code, body := dashboardPost(t, addr, fmt.Sprintf("/ui/deliveries/%d/retry", id), nil)
	if code != http.StatusConflict || !strings.Contains(body, "claimed for sending to recorder") {
		t.Errorf("dashboard Retry while the attempt is in flight: %d %s; want 409, saying why", code, body)
	}
	// A redirect would take the number of the attempt in flight: refused
	// too, sending nothing.
	inspector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got["inspector"]++
		mu.Unlock()
	}))
	defer inspector.Close()
	code, stdout, stderr = e.run(ctx, "deliveries", "redirect", fmt.Sprint(id), inspector.URL)
	if code == exitOK || !strings.Contains(stderr, "claimed for sending to recorder") {
		t.Errorf("CLI redirect while the attempt is in flight: exit %d\n%s%s\nwant refused, saying why", code, stdout, stderr)
	}
	code, body = dashboardPost(t, addr, fmt.Sprintf("/ui/deliveries/%d/redirect", id), url.Values{"url": {inspector.URL}})
	if code != http.StatusConflict || !strings.Contains(body, "claimed for sending to recorder") {
		t.Errorf("dashboard Redirect while the attempt is in flight: %d %s; want 409, saying why", code, body)
	}
	mu.Lock()
	if got["inspector"] != 0 {
		t.Errorf("a refused redirect reached the inspector %d times", got["inspector"])
	}
	mu.Unlock()
	let()

	// A delivery queued after it is delivered after it: had a retry
	// requeued evt_held, it would have been sent again before.
	proxyPost(t, addr, "evt_after", `{"n":2}`)
	waitFor(t, 30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got["evt_after"] == 1
	})
	mu.Lock()
	defer mu.Unlock()
	if got["evt_held"] != 1 {
		t.Errorf("the target got evt_held %d times, want once", got["evt_held"])
	}
	row, _, err := db.Delivery(ctx, id)
	if err != nil || row.Status != "delivered" || row.Attempts != 1 || !row.ClaimedUntil.IsZero() {
		t.Errorf("delivery after its attempt: %+v %v; want delivered in one attempt, no longer claimed", row, err)
	}
}
