package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	stdsync "sync"
	"syscall"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// recorder is a delivery target that counts what it receives by event id.
type recorder struct {
	mu      stdsync.Mutex
	byEvent map[string]int
	total   int
	bodies  map[string]string
}

func newRecorder() *recorder {
	return &recorder{byEvent: map[string]int{}, bodies: map[string]string{}}
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	id := r.Header.Get("X-Event-Id")
	rc.mu.Lock()
	rc.byEvent[id]++
	rc.total++
	rc.bodies[id] = string(b)
	rc.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

func (rc *recorder) counts() (distinct, total int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.byEvent), rc.total
}

func (e *env) writeDeliveryConfig(addr, targetURL string) {
	e.writeServeConfig(addr, fmt.Sprintf(`  proxy_token: proxy-secret-token
targets:
  - name: recorder
    url: %s
    secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
    allow_private: true
    connect_timeout: 1s
    timeout: 1s
    retry_schedule: [100ms, 200ms, 400ms, 800ms]
`, targetURL))
}

func proxyPost(t *testing.T, addr, eventID, body string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/outbox/recorder", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer proxy-secret-token")
	req.Header.Set("X-Event-Id", eventID)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusAccepted {
		t.Fatalf("proxy answered %d", res.StatusCode)
	}
}

// SIGKILL during the delivery of 1,000 events, restart: every event is
// delivered at least once, and a repeat carries the same X-Event-Id.
func TestDeliverySurvivesSIGKILL(t *testing.T) {
	rec := newRecorder()
	target := httptest.NewServer(rec)
	defer target.Close()
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeDeliveryConfig(addr, target.URL)
	env := append(e.environ(e.sim.APIKey()), "BOTIX_WEBHOOK_SECRET="+webhookSecret)

	first, lines := e.startBinaryEnv(env, "serve")
	waitLines(t, lines, "serving", 1, 30*time.Second)
	const n = 1000
	var wg stdsync.WaitGroup
	ids := make(chan int, n)
	for i := range n {
		ids <- i
	}
	close(ids)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range ids {
				proxyPost(t, addr, fmt.Sprintf("evt_kill_%04d", i), fmt.Sprintf(`{"n":%d}`, i))
			}
		}()
	}
	wg.Wait()
	waitFor(t, time.Minute, func() bool { d, _ := rec.counts(); return d >= 100 })
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.cmd.Wait()
	atKill, _ := rec.counts()
	if atKill >= n {
		t.Fatalf("all %d were delivered before the kill: the test proves nothing", n)
	}

	second, lines := e.startBinaryEnv(env, "serve")
	waitLines(t, lines, "serving", 1, 30*time.Second)
	// Every row delivered in the store: those the first process sent but
	// had not recorded when it was killed are sent again once their lease
	// (12 s with this config) ends.
	db, err := store.Open(context.Background(), e.db, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	delivered := func() backstop.TargetState {
		states, err := db.TargetStates(context.Background(), []string{"recorder"})
		if err != nil {
			t.Fatal(err)
		}
		return states[0]
	}
	waitFor(t, 2*time.Minute, func() bool { return delivered().Delivered == n })
	second.cmd.Process.Signal(syscall.SIGTERM)
	second.cmd.Wait()

	distinct, total := rec.counts()
	t.Logf("killed after %d distinct deliveries; in the end %d distinct, %d requests (%d repeats)", atKill, distinct, total, total-distinct)
	for i := range n {
		id := fmt.Sprintf("evt_kill_%04d", i)
		if !strings.Contains(rec.bodies[id], fmt.Sprintf(`"n":%d`, i)) {
			t.Fatalf("%s arrived with body %q", id, rec.bodies[id])
		}
	}
	if distinct != n {
		t.Errorf("%d distinct events reached the target, want %d", distinct, n)
	}
	if s := delivered(); s.Delivered != n || s.DeadLetter != 0 || s.Pending+s.Retrying != 0 {
		t.Errorf("outbox after restart: %+v, want all %d delivered", s, n)
	}
}

// CLI retry and redirect, end to end: a dead letter is redirected to an
// inspector (status unchanged), then retried and delivered by serve.
func TestDeliveriesRetryAndRedirect(t *testing.T) {
	var failing stdsync.Mutex
	fail := true
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		failing.Lock()
		defer failing.Unlock()
		if fail {
			http.Error(w, "no such hook", http.StatusNotFound)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer target.Close()
	inspector := newRecorder()
	insp := httptest.NewServer(inspector)
	defer insp.Close()
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeDeliveryConfig(addr, target.URL)
	stopServe := serveInProcess(t, e, addr)
	proxyPost(t, addr, "evt_retry_1", `{"hello":"world","a":1}`)
	listJSON := func() []deliveryRow {
		code, stdout, stderr := e.run(context.Background(), "deliveries", "list", "--json")
		if code != 0 {
			t.Fatalf("list: %d %s", code, stderr)
		}
		var rows []deliveryRow
		if err := jsonUnmarshal(stdout, &rows); err != nil {
			t.Fatal(err)
		}
		return rows
	}
	waitFor(t, 30*time.Second, func() bool { r := listJSON(); return len(r) == 1 && r[0].Status == "dead_letter" })
	id := fmt.Sprint(listJSON()[0].ID)

	code, stdout, stderr := e.run(context.Background(), "deliveries", "redirect", id, insp.URL)
	if code != 0 || !strings.Contains(stdout, "200") {
		t.Fatalf("redirect: %d %s %s", code, stdout, stderr)
	}
	if d, _ := inspector.counts(); d != 1 || !strings.Contains(inspector.bodies["evt_retry_1"], `"hello"`) {
		t.Fatalf("the inspector did not get the payload: %v", inspector.bodies)
	}
	if r := listJSON()[0]; r.Status != "dead_letter" {
		t.Errorf("redirect changed the delivery's status to %s", r.Status)
	}

	failing.Lock()
	fail = false
	failing.Unlock()
	if code, _, stderr := e.run(context.Background(), "deliveries", "retry", id); code != 0 {
		t.Fatalf("retry: %d %s", code, stderr)
	}
	waitFor(t, 30*time.Second, func() bool { return listJSON()[0].Status == "delivered" })
	code, stdout, _ = e.run(context.Background(), "deliveries", "show", id)
	if code != 0 || !strings.Contains(stdout, "(redirect)") || !strings.Contains(stdout, "404") || !strings.Contains(stdout, "204") {
		t.Errorf("show lacks the attempts:\n%s", stdout)
	}
	// The payload is shown indented, its keys in the order the target gets.
	if !strings.Contains(stdout, "payload:\n  {\n    \"hello\": \"world\",\n    \"a\": 1\n  }\n") {
		t.Errorf("show's payload is not the stored envelope, indented:\n%s", stdout)
	}
	serveLog := stopServe()
	// Each log line names its component once (the dispatcher logged the
	// 404 and the delivery).
	if !strings.Contains(serveLog, "component=delivery") {
		t.Errorf("serve logged nothing of delivery:\n%s", serveLog)
	}
	for line := range strings.SplitSeq(serveLog, "\n") {
		if strings.Count(line, "component=") > 1 {
			t.Errorf("log line names its component twice: %s", line)
		}
	}
}

// TestServeWarnsOfAnUnsignedTarget: a target whose secret came from an
// unset variable gets its deliveries unsigned; serve says so when it starts,
// naming the file, line, key and variable.
func TestServeWarnsOfAnUnsignedTarget(t *testing.T) {
	addr := freeAddr(t)
	e := newServeEnv(t, addr, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	data, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	e.writeConfig(strings.Replace(string(data), `events: ["payment.*"]`, `secret: "${BACKSTOP_TEST_UNSET_SECRET}"`, 1))
	stderr := serveInProcess(t, e, addr)()
	want := `level=WARN msg="configuration: targets[0].secret is empty (BACKSTOP_TEST_UNSET_SECRET unset or empty): deliveries to billing are sent unsigned" file=` +
		e.config + ` line=11 key=targets[0].secret`
	if !strings.Contains(stderr, want) {
		t.Errorf("serve did not warn %q:\n%s", want, stderr)
	}
}

// serveInProcess runs serve (through Main, in-process) with the
// webhook secret set until stop is called, once its intake on addr
// answers; stop returns what serve wrote to stderr, and the test fails if
// serve did not exit 0. A test that ends before calling stop (a Fatal)
// stops serve at its cleanup.
func serveInProcess(t *testing.T, e *env, addr string) (stop func() string) {
	t.Helper()
	t.Setenv("BOTIX_WEBHOOK_SECRET", webhookSecret)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan string, 1)
	go func() {
		code, _, stderr := e.run(ctx, "serve")
		if code != 0 {
			t.Errorf("serve exit %d\n%s", code, stderr)
		}
		done <- stderr
	}()
	stop = stdsync.OnceValue(func() string {
		cancel()
		return <-done
	})
	t.Cleanup(func() { stop() })
	waitFor(t, 30*time.Second, func() bool {
		res, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			res.Body.Close()
		}
		return err == nil
	})
	return stop
}

// waitFor polls cond with a deadline.
func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", d)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }

// targets[].concurrency reaches the dispatcher: with deliveries queued for a
// target that, after its first answer, holds every request until four are
// in flight at once, serve must send them side by side (one after another,
// the second would wait for company that never comes).
func TestTargetConcurrencyFromConfig(t *testing.T) {
	const want = 4
	var mu stdsync.Mutex
	answered, inFlight, peak := 0, 0, 0
	release := make(chan struct{})
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		answered++
		if answered == 1 {
			// The first answer at once: until a target has answered, its
			// pacer lets one request through at a time.
			mu.Unlock()
			return
		}
		inFlight++
		peak = max(peak, inFlight)
		if inFlight == want {
			close(release)
		}
		mu.Unlock()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		mu.Lock()
		inFlight--
		mu.Unlock()
	}))
	defer target.Close()
	addr := freeAddr(t)
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.writeDeliveryConfig(addr, target.URL)
	base, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	// Long timeout: with concurrency 1 the first request would wait for
	// company that never comes, and time out.
	cfg := strings.Replace(string(base), "    timeout: 1s\n", fmt.Sprintf("    timeout: 60s\n    concurrency: %d\n", want), 1)
	e.writeConfig(cfg)
	env := append(e.environ(e.sim.APIKey()), "BOTIX_WEBHOOK_SECRET="+webhookSecret)
	db, err := store.Open(context.Background(), e.db, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range want + 1 {
		if _, err := db.Enqueue(context.Background(), "recorder", fmt.Sprintf("evt_conc_%d", i), "test.event",
			[]byte(fmt.Sprintf(`{"n":%d}`, i)), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	srv, lines := e.startBinaryEnv(env, "serve")
	defer func() {
		srv.cmd.Process.Signal(syscall.SIGTERM)
		srv.cmd.Wait()
	}()
	waitLines(t, lines, "serving", 1, 30*time.Second)
	select {
	case <-release:
	case <-time.After(time.Minute):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("at most %d requests were in flight at once, want %d (targets[].concurrency: %d)", peak, want, want)
	}
}
