package intake_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	stdsync "sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/internal/syncbuf"
	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/store"
)

const secret = "test-webhook-secret"

type intakeEnv struct {
	t       *testing.T
	db      *store.DB
	srv     *httptest.Server
	writer  *intake.Batcher
	metrics *intake.Metrics
}

func newIntake(t *testing.T, configure func(*http.Server)) *intakeEnv {
	t.Helper()
	return newIntakeWith(t, intake.HandlerOptions{}, configure)
}

// newIntakeWith is newIntake with the handler's options (its Metrics are
// the env's).
func newIntakeWith(t *testing.T, opts intake.HandlerOptions, configure func(*http.Server)) *intakeEnv {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "intake.db"), store.Options{Synchronous: "FULL"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	v, err := intake.NewVerifier("botix", intake.SchemeOptions{Secrets: []string{secret}})
	if err != nil {
		t.Fatal(err)
	}
	m := intake.NewMetrics(prometheus.NewRegistry())
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}, {Target: "crm", Events: []string{"contact.*"}}}
	w := intake.NewBatcher(db, intake.BatcherOptions{Routes: routes, Observe: m.ObserveCommit})
	done := make(chan struct{})
	go func() { defer close(done); w.Run(context.Background()) }()
	t.Cleanup(func() { w.Close(context.Background()); <-done })
	opts.Metrics = m
	srv := httptest.NewUnstartedServer(intake.NewHandler(v, w, opts))
	srv.Config.ReadTimeout = 2 * time.Second
	srv.Config.ReadHeaderTimeout = 2 * time.Second
	if configure != nil {
		configure(srv.Config)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return &intakeEnv{t: t, db: db, srv: srv, writer: w, metrics: m}
}

func paymentEvent(id, payID, updatedAt, status string) []byte {
	return []byte(fmt.Sprintf(`{"event_id":%q,"event":"payment.%s","created_at":%q,"data":{"id":%q,"contact_id":"ct_1","amount":1250,"currency":"EUR","status":%q,"created_at":"2026-01-01T00:00:00Z","updated_at":%q}}`,
		id, status, updatedAt, payID, status, updatedAt))
}

// post sends body signed with the botix scheme and returns status and body.
func (e *intakeEnv) post(body []byte, mutate func(*http.Request)) (int, string) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Botix-Signature", intake.SignBotix(secret, body))
	if mutate != nil {
		mutate(req)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("post: %v", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func (e *intakeEnv) processed() int {
	e.t.Helper()
	n, err := e.db.CountProcessed(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

func TestAcceptedThenDuplicate(t *testing.T) {
	e := newIntake(t, nil)
	body := paymentEvent("evt_1", "pay_1", "2026-03-01T10:00:00Z", "succeeded")
	if code, resp := e.post(body, nil); code != 200 || !strings.Contains(resp, `"accepted"`) {
		t.Fatalf("first: %d %s", code, resp)
	}
	if code, resp := e.post(body, nil); code != 200 || !strings.Contains(resp, `"duplicate"`) {
		t.Fatalf("second: %d %s", code, resp)
	}
	// The same version under another event id is a duplicate too.
	other := paymentEvent("evt_2", "pay_1", "2026-03-01T10:00:00.000000Z", "succeeded")
	if code, resp := e.post(other, nil); code != 200 || !strings.Contains(resp, `"duplicate"`) {
		t.Fatalf("same version, new id: %d %s", code, resp)
	}
	rows, err := e.db.OutboxRows(context.Background(), "billing")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || e.processed() != 1 {
		t.Errorf("outbox rows %d, processed %d; want 1 and 1", len(rows), e.processed())
	}
	obj, ok, err := e.db.Get(context.Background(), backstop.Payments, "pay_1")
	if err != nil || !ok || !strings.Contains(string(obj.Data), `"succeeded"`) {
		t.Errorf("mirror: %v %v %s", ok, err, obj.Data)
	}
}

func TestFlippedByteIsRefusedAndNothingStored(t *testing.T) {
	e := newIntake(t, nil)
	body := paymentEvent("evt_1", "pay_1", "2026-03-01T10:00:00Z", "succeeded")
	sig := intake.SignBotix(secret, body)
	flipped := bytes.Clone(body)
	flipped[len(flipped)/2] ^= 0x01
	code, resp := e.post(flipped, func(r *http.Request) { r.Header.Set("X-Botix-Signature", sig) })
	if code != 401 || !strings.Contains(resp, `"message"`) {
		t.Fatalf("flipped byte: %d %s, want 401 with a JSON message", code, resp)
	}
	if n := e.processed(); n != 0 {
		t.Errorf("%d rows stored for a refused request", n)
	}
}

func TestConcurrentCopiesOfOneEvent(t *testing.T) {
	e := newIntake(t, nil)
	body := paymentEvent("evt_same", "pay_9", "2026-03-01T10:00:00Z", "succeeded")
	const copies = 50
	codes := make(chan int, copies)
	bodies := make(chan string, copies)
	var wg stdsync.WaitGroup
	start := make(chan struct{})
	for range copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			code, resp := e.post(body, nil)
			codes <- code
			bodies <- resp
		}()
	}
	close(start)
	wg.Wait()
	close(codes)
	close(bodies)
	accepted := 0
	for code := range codes {
		if code != 200 {
			t.Errorf("a copy got %d", code)
		}
	}
	for b := range bodies {
		if strings.Contains(b, "locked") {
			t.Errorf("answer mentions a lock: %s", b)
		}
		if strings.Contains(b, `"accepted"`) {
			accepted++
		}
	}
	if accepted != 1 || e.processed() != 1 {
		t.Errorf("accepted %d, processed rows %d; want exactly one of each", accepted, e.processed())
	}
	rows, _ := e.db.OutboxRows(context.Background(), "billing")
	if len(rows) != 1 {
		t.Errorf("%d outbox rows, want 1", len(rows))
	}
}

func TestOlderVersionNeverOverwritesTheMirror(t *testing.T) {
	e := newIntake(t, nil)
	newer := paymentEvent("evt_new", "pay_5", "2026-03-01T10:00:05Z", "refunded")
	older := paymentEvent("evt_old", "pay_5", "2026-03-01T10:00:01Z", "succeeded")
	for _, b := range [][]byte{newer, older} {
		if code, resp := e.post(b, nil); code != 200 {
			t.Fatalf("%d %s", code, resp)
		}
	}
	obj, _, err := e.db.Get(context.Background(), backstop.Payments, "pay_5")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(obj.Data), `"refunded"`) {
		t.Errorf("mirror went back in time: %s", obj.Data)
	}
	if e.processed() != 2 {
		t.Errorf("both versions are events and must be recorded; got %d", e.processed())
	}
}

func TestRefusedRequestsStoreNothing(t *testing.T) {
	e := newIntake(t, nil)
	good := paymentEvent("evt_ok", "pay_1", "2026-03-01T10:00:00Z", "pending")
	big := []byte(`{"event_id":"evt_big","event":"payment.pending","data":{"id":"pay_2","updated_at":"2026-03-01T10:00:00Z","pad":"` + strings.Repeat("x", 70<<10) + `"}}`)
	cases := []struct {
		name   string
		body   []byte
		mutate func(*http.Request)
		want   int
	}{
		{"oversize with Content-Length", big, nil, 413},
		{"oversize chunked", big, func(r *http.Request) { r.ContentLength = -1; r.Body = io.NopCloser(bytes.NewReader(big)) }, 413},
		{"malformed JSON", []byte(`{"event_id":`), nil, 400},
		{"missing event id", []byte(`{"event":"payment.pending","data":{"id":"pay_1","updated_at":"2026-03-01T10:00:00Z"}}`), nil, 400},
		{"control character in id", []byte(`{"event_id":"evt\u0001x","event":"payment.pending","data":{"id":"pay_1","updated_at":"2026-03-01T10:00:00Z"}}`), nil, 400},
		{"a data key twice", []byte(`{"event_id":"evt_dup","event":"payment.pending","data":{"id":"pay_1","status":"failed","updated_at":"2026-03-01T10:00:00Z","status":"succeeded"}}`), nil, 400},
		{"a nested key twice", []byte(`{"event_id":"evt_dup2","event":"payment.pending","data":{"id":"pay_1","updated_at":"2026-03-01T10:00:00Z","refund":{"amount":1,"amount":1000}}}`), nil, 400},
		{"updated_at past year 9999", []byte(`{"event_id":"evt_y","event":"payment.pending","data":{"id":"pay_1","updated_at":"9999-12-31T23:30:00-01:00"}}`), nil, 400},
		{"right-to-left override in an id", []byte(`{"event_id":"evt_\u202ex","event":"payment.pending","data":{"id":"pay_1","updated_at":"2026-03-01T10:00:00Z"}}`), nil, 400},
		{"wrong content type", good, func(r *http.Request) { r.Header.Set("Content-Type", "text/plain") }, 415},
		{"missing signature", good, func(r *http.Request) { r.Header.Del("X-Botix-Signature") }, 401},
		{"wrong method", nil, func(r *http.Request) { r.Method = http.MethodGet }, 405},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, resp := e.post(c.body, c.mutate)
			if code != c.want {
				t.Fatalf("status %d, want %d: %s", code, c.want, resp)
			}
			var msg struct {
				Error struct{ Code, Message string }
			}
			if err := json.Unmarshal([]byte(resp), &msg); err != nil || msg.Error.Message == "" {
				t.Errorf("error body is not JSON with a message: %q", resp)
			}
		})
	}
	if n := e.processed(); n != 0 {
		t.Errorf("%d rows stored for refused requests", n)
	}
	if code, _ := e.post(good, nil); code != 200 {
		t.Errorf("server not up after the refusals: %d", code)
	}
}

// A body that trickles in, or stalls, is answered 408 body_timeout in JSON
// once the handler's body timeout has passed, on a server whose ReadTimeout
// and WriteTimeout are equal (as serve's are): had the handler waited for
// the server's read timeout, its write deadline would have passed with it
// and the sender would only see the connection close. The same holds when
// the body timeout is longer than the server's. Nothing is stored and the
// server stays up.
func TestSlowBodyGets408(t *testing.T) {
	for _, c := range []struct {
		name    string
		trickle bool
		// body is the handler's body timeout, server the server's read
		// and write timeouts.
		body, server time.Duration
	}{
		{"a byte every 100ms", true, time.Second, 3 * time.Second},
		{"stalled", false, time.Second, 3 * time.Second},
		// The answer gets its own write deadline.
		{"past the server's write timeout", true, 2 * time.Second, time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newIntakeWith(t, intake.HandlerOptions{BodyTimeout: c.body}, func(s *http.Server) {
				s.ReadTimeout, s.WriteTimeout = c.server, c.server
			})
			body := paymentEvent("evt_slow", "pay_1", "2026-03-01T10:00:00Z", "pending")
			head := fmt.Sprintf("POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Botix-Signature: %s\r\nContent-Length: %d\r\n\r\n",
				intake.SignBotix(secret, body), len(body))
			res := sendSlowly(t, e.srv.URL, head, body, c.trickle)
			if !res.Close {
				t.Error("the 408 keeps the connection open, with the body half read")
			}
			if n := testutil.ToFloat64(e.metrics.Requests.WithLabelValues("timeout")); n != 1 {
				t.Errorf("timeout outcomes counted: %v, want 1", n)
			}
			if e.processed() != 0 {
				t.Error("a partial body was stored")
			}
			if code, _ := e.post(body, nil); code != 200 {
				t.Errorf("server not up after a slow client: %d", code)
			}
		})
	}
}

func TestDrainAnswers503(t *testing.T) {
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "d.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	v, _ := intake.NewVerifier("botix", intake.SchemeOptions{Secrets: []string{secret}})
	w := intake.NewBatcher(db, intake.BatcherOptions{})
	go w.Run(context.Background())
	defer w.Close(context.Background())
	h := intake.NewHandler(v, w, intake.HandlerOptions{})
	h.Drain()
	body := paymentEvent("evt_1", "pay_1", "2026-03-01T10:00:00Z", "pending")
	req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Botix-Signature", intake.SignBotix(secret, body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 503 || rec.Header().Get("Retry-After") == "" || rec.Header().Get("Connection") != "close" {
		t.Fatalf("draining: %d, Retry-After %q, Connection %q; want 503, a Retry-After, close",
			rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get("Connection"))
	}
	if n, err := db.CountProcessed(context.Background()); err != nil {
		t.Fatal(err)
	} else if n != 0 {
		t.Error("stored while draining")
	}
}

// sendSlowly sends head and the first bytes of body to the server at url,
// then, when trickle is true, one more byte every 100 ms, never the last
// one (otherwise nothing more), and returns the answer once it comes,
// which must be a 408 JSON body_timeout error.
func sendSlowly(t *testing.T, url, head string, body []byte, trickle bool) *http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprint(conn, head)
	conn.Write(body[:5])
	answered := make(chan struct{})
	defer close(answered)
	if trickle {
		go func() {
			tick := time.NewTicker(100 * time.Millisecond) // the sender's pace, not a wait for the server
			defer tick.Stop()
			for i := 5; i < len(body)-1; i++ { // never the whole body
				select {
				case <-answered:
					return
				case <-tick.C:
				}
				if _, err := conn.Write(body[i : i+1]); err != nil {
					return
				}
			}
		}()
	}
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a slow body: %v", err)
	}
	resp, _ := io.ReadAll(res.Body)
	var msg struct {
		Error struct{ Code, Message string }
	}
	if res.StatusCode != http.StatusRequestTimeout || json.Unmarshal(resp, &msg) != nil || msg.Error.Code != "body_timeout" || msg.Error.Message == "" {
		t.Errorf("slow body answered %d %s, want 408 with a JSON body_timeout error", res.StatusCode, resp)
	}
	return res
}

// testClock is a clock a test moves by hand, safe for concurrent use.
type testClock struct {
	mu  stdsync.Mutex
	now time.Time
}

// Now returns the clock's time.
func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Add moves the clock on by d.
func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Anyone can send requests whose signature fails: a flood of them writes
// one warning a second, the next one saying how many were not logged,
// rather than a line each; the metric still counts every one.
func TestBadSignaturesAreLoggedAtMostOnceASecond(t *testing.T) {
	var logs syncbuf.Buffer
	clock := &testClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	e := newIntakeWith(t, intake.HandlerOptions{Now: clock.Now, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, nil)
	body := paymentEvent("evt_forged", "pay_1", "2026-03-01T10:00:00Z", "succeeded")
	forge := func(r *http.Request) { r.Header.Set("X-Botix-Signature", intake.SignBotix("guessed-secret", body)) }
	for i := range 50 {
		if code, _ := e.post(body, forge); code != http.StatusUnauthorized {
			t.Fatalf("forged request %d: %d, want 401", i+1, code)
		}
	}
	if n := strings.Count(logs.String(), "bad signature"); n != 1 {
		t.Fatalf("%d warnings for 50 refused signatures within a second, want 1:\n%s", n, logs.String())
	}
	clock.Add(time.Second)
	e.post(body, forge)
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "not_logged_since_last=49") {
		t.Errorf("a second later: %d lines, want 2, the last saying 49 were not logged:\n%s", len(lines), logs.String())
	}
	if got := testutil.ToFloat64(e.metrics.SignatureFailures); got != 51 {
		t.Errorf("signature failures counted %v, want 51", got)
	}
	if e.processed() != 0 {
		t.Error("a forged event was stored")
	}
}

// While the store refuses commits, every webhook fails: the failures are
// logged at most once a second, in one line per request at most (not one
// from the handler and another from the writer), the next line saying how
// many were not logged.
func TestStoreFailuresAreLoggedAtMostOnceASecond(t *testing.T) {
	var logs syncbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	clock := &testClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "intake.db"), store.Options{Synchronous: "FULL"})
	if err != nil {
		t.Fatal(err)
	}
	v, err := intake.NewVerifier("botix", intake.SchemeOptions{Secrets: []string{secret}})
	if err != nil {
		t.Fatal(err)
	}
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	w := intake.NewBatcher(db, intake.BatcherOptions{Routes: routes, Logger: logger})
	done := make(chan struct{})
	go func() { defer close(done); w.Run(context.Background()) }()
	t.Cleanup(func() { w.Close(context.Background()); <-done })
	srv := httptest.NewServer(intake.NewHandler(v, w, intake.HandlerOptions{Now: clock.Now, Logger: logger}))
	t.Cleanup(srv.Close)
	e := &intakeEnv{t: t, db: db, srv: srv, writer: w}
	db.Close() // every commit fails from here on

	for i := range 20 {
		body := paymentEvent(fmt.Sprintf("evt_%d", i), "pay_1", "2026-03-01T10:00:00Z", "succeeded")
		if code, _ := e.post(body, nil); code != http.StatusServiceUnavailable {
			t.Fatalf("request %d with the store closed: %d, want 503", i+1, code)
		}
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
		t.Fatalf("%d error lines for 20 failed commits within a second, want 1:\n%s", n, logs.String())
	}
	clock.Add(time.Second)
	e.post(paymentEvent("evt_last", "pay_1", "2026-03-01T10:00:00Z", "succeeded"), nil)
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "not_logged_since_last=19") {
		t.Errorf("a second later: %d lines, want 2, the last saying 19 were not logged:\n%s", len(lines), logs.String())
	}
}

// A request whose Content-Length is over the limit by less than 256 KiB got
// its 413 only once net/http had waited, for as long as ReadTimeout, for
// the body it throws away before answering: the client, sending no more,
// got no answer at all (found by an audit: 30 s, then the connection
// closed). The answer now closes the connection and comes at once.
func TestOversizeDeclaredBodyIsAnsweredAtOnce(t *testing.T) {
	e := newIntake(t, func(s *http.Server) { s.ReadTimeout = 30 * time.Second })
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /webhooks/botix HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", intake.MaxBody+4464)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer within 5 s to a request declaring a body over the limit: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestEntityTooLarge || !res.Close {
		t.Errorf("answer %d (close %v), want 413 closing the connection", res.StatusCode, res.Close)
	}
}

// Every JSON media type is taken: parameters, case, and the structured
// syntax suffix +json (RFC 6839) that some platforms send; others get 415.
func TestJSONMediaTypesAccepted(t *testing.T) {
	e := newIntake(t, nil)
	for i, ct := range []string{"application/json; charset=utf-8", "Application/JSON", "application/vnd.botix.event+json", "application/cloudevents+json; charset=UTF-8"} {
		body := paymentEvent(fmt.Sprintf("evt_ct%d", i), fmt.Sprintf("pay_ct%d", i), "2026-03-01T10:00:00Z", "pending")
		if code, resp := e.post(body, func(r *http.Request) { r.Header.Set("Content-Type", ct) }); code != 200 {
			t.Errorf("Content-Type %q: %d %s, want 200", ct, code, resp)
		}
	}
	for _, ct := range []string{"text/json", "application/jsonx", "application/+json", "application/x-www-form-urlencoded", ""} {
		if code, resp := e.post(paymentEvent("evt_bad", "pay_bad", "2026-03-01T10:00:00Z", "pending"), func(r *http.Request) { r.Header.Set("Content-Type", ct) }); code != 415 {
			t.Errorf("Content-Type %q: %d %s, want 415", ct, code, resp)
		}
	}
}
