package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	stdsync "sync"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sources/sim"
)

// writeOrderConfig writes a configuration whose one target, recorder, has
// a 3 s timeout: a claim may send its rows for 3 s, so a 429 asking for 4 s
// outlasts it and the row it answered is released back to the queue.
func (e *env) writeOrderConfig(addr, targetURL string) {
	e.writeConfig(fmt.Sprintf(`source:
  base_url: %s
  api_key: ${BOTIX_API_KEY}
store:
  path: %s
intake:
  listen: %s
  secret: ${BOTIX_WEBHOOK_SECRET}
  proxy_token: proxy-secret-token
targets:
  - name: recorder
    url: %s
    allow_private: true
    connect_timeout: 1s
    timeout: 3s
`, e.srv.URL, e.db, addr, targetURL))
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
