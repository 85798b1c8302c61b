package delivery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sinks/intake"
)

const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// hit is one request a test server saw.
type hit struct {
	at     time.Time
	header http.Header
	body   []byte
	path   string
}

// recorder is a test target: answer decides each response from the
// request's number (1-based); every request is kept.
type recorder struct {
	mu     sync.Mutex
	hits   []hit
	answer func(n int, w http.ResponseWriter, r *http.Request)
	srv    *httptest.Server
}

func newRecorder(t *testing.T, answer func(n int, w http.ResponseWriter, r *http.Request)) *recorder {
	t.Helper()
	rec := &recorder{answer: answer}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.hits = append(rec.hits, hit{at: time.Now(), header: r.Header.Clone(), body: body, path: r.URL.Path})
		n := len(rec.hits)
		rec.mu.Unlock()
		rec.answer(n, w, r)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (rec *recorder) all() []hit {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]hit(nil), rec.hits...)
}

func status(code int) func(int, http.ResponseWriter, *http.Request) {
	return func(_ int, w http.ResponseWriter, _ *http.Request) { w.WriteHeader(code) }
}

// start runs a dispatcher over q until the test ends.
func start(t *testing.T, q Queue, targets []Target, opts Options) *Dispatcher {
	t.Helper()
	if opts.Poll == 0 {
		opts.Poll = 20 * time.Millisecond
	}
	if opts.Rand == nil {
		opts.Rand = func() float64 { return 0.5 } // no jitter
	}
	if opts.StopGrace == 0 {
		opts.StopGrace = time.Second // tests' slow targets need not be waited for
	}
	d, err := New(q, targets, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return after cancel")
		}
	})
	return d
}

func ms(steps ...int) []time.Duration {
	out := make([]time.Duration, len(steps))
	for i, s := range steps {
		out[i] = time.Duration(s) * time.Millisecond
	}
	return out
}

func codes(as []Attempt) []int {
	out := make([]int, len(as))
	for i, a := range as {
		out[i] = a.StatusCode
	}
	return out
}

func TestRetriesOnScheduleThenDelivers(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n <= 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	sched := ms(40, 80, 120, 160)
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "payment.succeeded", `{"id":"pay_1"}`)
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, RetrySchedule: sched}}, Options{})

	q.waitFor(t, 10*time.Second, "delivery", q.rowStatus(t, id, StatusDelivered))
	as := q.attemptsOf(t, id)
	if got, want := fmt.Sprint(codes(as)), "[503 503 503 200]"; got != want {
		t.Fatalf("attempt codes %s, want %s", got, want)
	}
	for i, a := range as {
		if a.Attempt != i+1 || a.Redirect || a.RequestID == "" || a.URL != rec.srv.URL {
			t.Errorf("attempt %d = %+v", i+1, a)
		}
		if i > 0 {
			if gap := a.At.Sub(as[i-1].At); gap < sched[i-1] {
				t.Errorf("attempt %d came %v after attempt %d, want at least %v", i+1, gap, i, sched[i-1])
			}
		}
	}
	hits := rec.all()
	seen := map[string]bool{}
	for i, h := range hits {
		if got := h.header.Get(HeaderDeliveryAttempt); got != fmt.Sprint(i+1) {
			t.Errorf("request %d: %s %q", i+1, HeaderDeliveryAttempt, got)
		}
		if got := h.header.Get(HeaderEventID); got != "evt_1" {
			t.Errorf("request %d: %s %q, want evt_1 on every attempt", i+1, HeaderEventID, got)
		}
		rid := h.header.Get(HeaderRequestID)
		if rid == "" || seen[rid] {
			t.Errorf("request %d: %s %q is empty or repeated", i+1, HeaderRequestID, rid)
		}
		seen[rid] = true
	}
	if r := q.row(t, id); r.Attempts != 4 || r.LastStatus != 200 {
		t.Errorf("row = %+v, want 4 attempts, last status 200", r)
	}
}

func TestAlwaysFailingDeadLettersAfterFiveAttempts(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "boom %d", n)
	})
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, RetrySchedule: ms(5, 5, 5, 5)}}, Options{})

	q.waitFor(t, 10*time.Second, "dead letter", q.rowStatus(t, id, StatusDeadLetter))
	as := q.attemptsOf(t, id)
	if got, want := fmt.Sprint(codes(as)), "[500 500 500 500 500]"; got != want {
		t.Fatalf("attempt codes %s, want %s", got, want)
	}
	if last := as[4]; last.Body != "boom 5" || last.Attempt != 5 {
		t.Errorf("last attempt %+v, want attempt 5 with body %q", last, "boom 5")
	}
	if r := q.row(t, id); r.LastStatus != 500 || r.Attempts != 5 {
		t.Errorf("row = %+v, want last status 500 after 5 attempts", r)
	}
}

func TestLongBodyKeepsFirst4KiB(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, strings.Repeat("x", 10000))
	})
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true}}, Options{})
	q.waitFor(t, 10*time.Second, "dead letter", q.rowStatus(t, id, StatusDeadLetter))
	if n := len(q.attemptsOf(t, id)[0].Body); n != 4096 {
		t.Errorf("logged body is %d bytes, want 4096", n)
	}
}

func TestClientErrorsDeadLetterAtOnce(t *testing.T) {
	t.Parallel()
	for _, code := range []int{400, 401, 404, 422} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			t.Parallel()
			rec := newRecorder(t, status(code))
			q := newStoreQueue(t)
			id := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
			start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, RetrySchedule: ms(5, 5, 5, 5)}}, Options{})
			q.waitFor(t, 10*time.Second, "dead letter", q.rowStatus(t, id, StatusDeadLetter))
			if as := q.attemptsOf(t, id); len(as) != 1 || as[0].StatusCode != code {
				t.Errorf("attempts %v, want one %d", codes(as), code)
			}
			if q.state(t, "crm").Disabled {
				t.Errorf("target disabled after %d, want only after 410", code)
			}
		})
	}
}

func TestGoneDeadLettersAndDisablesTarget(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, status(http.StatusGone))
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
	d := start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true}}, Options{})
	q.waitFor(t, 10*time.Second, "dead letter", q.rowStatus(t, id, StatusDeadLetter))
	q.waitFor(t, 10*time.Second, "target disabled", func() bool { return q.state(t, "crm").Disabled })
	if r := q.state(t, "crm").DisabledReason; !strings.Contains(r, "410") {
		t.Errorf("disabled reason %q does not name the 410", r)
	}

	// A later row is not attempted: wait for two whole worker passes after
	// queueing it.
	id2 := q.add(t, "crm", "evt_2", "contact.created", `{"id":"ct_2"}`)
	passes := q.passesOf("crm")
	d.Wake("crm")
	q.waitFor(t, 10*time.Second, "two passes", func() bool { return q.passesOf("crm") >= passes+2 })
	if r := q.row(t, id2); r.Status != StatusPending || r.Attempts != 0 {
		t.Errorf("row for a disabled target = %+v, want pending and untouched", r)
	}
	if n := len(rec.all()); n != 1 {
		t.Errorf("disabled target got %d requests, want 1", n)
	}
}

func TestRetryAfterPausesOnlyThatTarget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// retryAfter returns the header to send at now and the earliest
		// time the target may be asked again.
		retryAfter func(now time.Time) (string, time.Time)
	}{
		{"delta seconds", func(now time.Time) (string, time.Time) { return "1", now.Add(time.Second) }},
		{"HTTP-date", func(now time.Time) (string, time.Time) {
			until := now.Add(2 * time.Second).UTC().Truncate(time.Second)
			return until.Format(http.TimeFormat), until
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var until atomic.Value
			limited := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n == 1 {
					v, u := tt.retryAfter(time.Now())
					until.Store(u)
					w.Header().Set("Retry-After", v)
					w.WriteHeader(http.StatusTooManyRequests)
					return
				}
				w.WriteHeader(http.StatusOK)
			})
			other := newRecorder(t, status(http.StatusOK))
			q := newStoreQueue(t)
			a1 := q.add(t, "limited", "evt_a1", "contact.created", `{"id":"ct_1"}`)
			a2 := q.add(t, "limited", "evt_a2", "contact.created", `{"id":"ct_2"}`)
			d := start(t, q, []Target{
				{Name: "limited", URL: limited.srv.URL, AllowPrivate: true, RetrySchedule: ms(5, 5, 5, 5)},
				{Name: "other", URL: other.srv.URL, AllowPrivate: true},
			}, Options{})

			q.waitFor(t, 10*time.Second, "the 429", func() bool { return q.row(t, a1).Attempts == 1 })
			// While "limited" is paused, "other" keeps delivering.
			for i := range 3 {
				id := q.add(t, "other", fmt.Sprintf("evt_b%d", i), "contact.created", `{"id":"ct_3"}`)
				d.Wake("other")
				q.waitFor(t, 10*time.Second, "other's delivery", q.rowStatus(t, id, StatusDelivered))
			}
			otherDone := time.Now()
			q.waitFor(t, 10*time.Second, "limited's deliveries", func() bool {
				return q.row(t, a1).Status == StatusDelivered && q.row(t, a2).Status == StatusDelivered
			})

			hits := limited.all()
			if len(hits) != 3 {
				t.Fatalf("limited got %d requests, want 3 (429, then the two rows)", len(hits))
			}
			u := until.Load().(time.Time)
			if hits[1].at.Before(u) {
				t.Errorf("limited was asked again %v before its Retry-After ended", u.Sub(hits[1].at))
			}
			if !otherDone.Before(u) {
				t.Errorf("other's deliveries ended at %v, after limited's pause (%v): not shown to go on meanwhile", otherDone, u)
			}
			if r := q.row(t, a1); r.Attempts != 2 {
				t.Errorf("row after 429 then 200: %d attempts, want 2", r.Attempts)
			}
		})
	}
}

func TestSignatureAndHeaders(t *testing.T) {
	t.Parallel()
	verifier, err := intake.NewVerifier(intake.SchemeStandardWebhooks, intake.SchemeOptions{Secrets: []string{testSecret}})
	if err != nil {
		t.Fatal(err)
	}
	signed := newRecorder(t, func(_ int, w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	unsigned := newRecorder(t, status(http.StatusOK))
	q := newStoreQueue(t)
	small := q.add(t, "signed", "evt_small", "payment.succeeded", `{"id":"pay_1","amount":100}`)
	big := q.emit(t, "signed", "evt_big", "note.created", fmt.Sprintf(`{"id":"msg_1","text":%q}`, strings.Repeat("a", 500)))
	plain := q.add(t, "unsigned", "evt_plain", "chat.opened", `{"id":"chat_1"}`)
	start(t, q, []Target{
		{Name: "signed", URL: signed.srv.URL, Secret: testSecret, AllowPrivate: true, MaxPayload: 300,
			Headers: map[string]string{"X-Custom": "yes", "Content-Type": "text/plain"}},
		{Name: "unsigned", URL: unsigned.srv.URL, AllowPrivate: true},
	}, Options{})
	for _, id := range []int64{small, big, plain} {
		q.waitFor(t, 10*time.Second, "delivery", q.rowStatus(t, id, StatusDelivered))
	}

	hits := signed.all()
	if len(hits) != 2 {
		t.Fatalf("signed target got %d requests, want 2", len(hits))
	}
	for _, h := range hits {
		if err := verifier.Verify(h.header, h.body, time.Now()); err != nil {
			t.Errorf("signature of %s: %v", h.header.Get(HeaderEventID), err)
		}
		for k, want := range map[string]string{"Content-Type": "application/json", "X-Custom": "yes",
			HeaderDeliveryAttempt: "1", intake.HeaderWebhookID: h.header.Get(HeaderEventID)} {
			if got := h.header.Get(k); got != want {
				t.Errorf("%s: %s %q, want %q", h.header.Get(HeaderEventID), k, got, want)
			}
		}
		if h.header.Get(HeaderRequestID) == "" {
			t.Errorf("no %s", HeaderRequestID)
		}
	}
	if got := hits[0].header.Get(HeaderEventType); got != "payment.succeeded" {
		t.Errorf("%s %q", HeaderEventType, got)
	}
	if got, want := string(hits[0].body), string(q.row(t, small).Payload); got != want {
		t.Errorf("small body %s, want the stored payload %s", got, want)
	}
	var env struct {
		EventID   string          `json:"event_id"`
		Data      json.RawMessage `json:"data"`
		Truncated bool            `json:"truncated"`
	}
	if err := json.Unmarshal(hits[1].body, &env); err != nil {
		t.Fatalf("big body: %v", err)
	}
	if !env.Truncated || string(env.Data) != `{"id":"msg_1"}` || env.EventID != "evt_big" || len(hits[1].body) > 300 {
		t.Errorf("big body not cut to its id: %s", hits[1].body)
	}

	uh := unsigned.all()
	if len(uh) != 1 || uh[0].header.Get(intake.HeaderWebhookSignature) != "" {
		t.Errorf("target without secret: got a %s header", intake.HeaderWebhookSignature)
	}
}

// A user and password in a target's URL are sent as HTTP Basic
// credentials, as net/http's Client sends them (they were dropped, and a
// target checking them answered 401, a dead letter at once); an
// Authorization header of the target's own wins over them.
func TestCredentialsInTheURLAreSentAsBasicAuth(t *testing.T) {
	t.Parallel()
	basic := newRecorder(t, status(http.StatusOK))
	bearer := newRecorder(t, status(http.StatusOK))
	withUser := func(raw string) string {
		return strings.Replace(raw, "http://", "http://crm-user:s3cr%3At@", 1) + "/in?token=abc"
	}
	q := newStoreQueue(t)
	a := q.add(t, "basic", "evt_1", "payment.succeeded", `{"id":"pay_1"}`)
	b := q.add(t, "bearer", "evt_2", "payment.succeeded", `{"id":"pay_2"}`)
	start(t, q, []Target{
		{Name: "basic", URL: withUser(basic.srv.URL), AllowPrivate: true},
		{Name: "bearer", URL: withUser(bearer.srv.URL), AllowPrivate: true, Headers: map[string]string{"Authorization": "Bearer own"}},
	}, Options{})
	for _, id := range []int64{a, b} {
		q.waitFor(t, 10*time.Second, "delivery", q.rowStatus(t, id, StatusDelivered))
	}
	h := basic.all()
	if len(h) != 1 {
		t.Fatalf("basic target got %d requests, want 1", len(h))
	}
	r := http.Request{Header: h[0].header}
	if user, pass, ok := r.BasicAuth(); !ok || user != "crm-user" || pass != "s3cr:t" {
		t.Errorf("basic target: Authorization %q, want Basic crm-user:s3cr:t", h[0].header.Get("Authorization"))
	}
	if h := bearer.all(); len(h) != 1 || h[0].header.Get("Authorization") != "Bearer own" {
		t.Errorf("target with its own Authorization header: %v", h)
	}
}

// A payload queued through the webhook proxy reaches its target under the
// caller's X-Event-Id (X-Event-Id, webhook-id and the signature), as it
// came; an event with the same id, emitted after it, is a delivery of its
// own rather than being taken for the proxied one.
func TestProxiedPayloadIsSentUnderTheCallersID(t *testing.T) {
	t.Parallel()
	verifier, err := intake.NewVerifier(intake.SchemeStandardWebhooks, intake.SchemeOptions{Secrets: []string{testSecret}})
	if err != nil {
		t.Fatal(err)
	}
	rec := newRecorder(t, status(http.StatusNoContent))
	q := newStoreQueue(t)
	ctx := context.Background()
	// Over the target's max_payload, with a data object and an id, as an
	// envelope has: a proxied body is sent as it came all the same (it
	// was cut to {"data":{"id"},"truncated":true}).
	body := `{"zeta":1,"data":{"id":"order-7","content":"deploy finished ` + strings.Repeat("z", 80) + `"}}`
	proxied, err := q.db.Enqueue(ctx, "ops", "alert-1", "proxy", json.RawMessage(body), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ev := backstop.Event{ID: "alert-1", Type: "alert.fired", Origin: backstop.OriginWebhook, Data: json.RawMessage(`{"level":"high"}`)}
	res, err := q.db.Emit(ctx, []backstop.Event{ev}, []backstop.Route{{Target: "ops", Events: []string{"*"}}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Status != backstop.EmitAccepted || res[0].Outbox != 1 {
		t.Fatalf("emit of alert-1 = %+v, want accepted with its outbox row", res[0])
	}
	q.notify()
	rows, err := q.db.OutboxRows(ctx, "ops")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Fatalf("ops has %d outbox rows, want the proxied payload's and the event's: %+v", len(rows), rows)
	}
	start(t, q, []Target{{Name: "ops", URL: rec.srv.URL, Secret: testSecret, AllowPrivate: true, MaxPayload: 100}}, Options{})
	for _, r := range rows {
		q.waitFor(t, 10*time.Second, "delivery", q.rowStatus(t, r.ID, StatusDelivered))
	}

	byType := map[string]hit{}
	for _, h := range rec.all() {
		if err := verifier.Verify(h.header, h.body, time.Now()); err != nil {
			t.Errorf("signature of the %s request: %v", h.header.Get(HeaderEventType), err)
		}
		for _, k := range []string{HeaderEventID, intake.HeaderWebhookID} {
			if got := h.header.Get(k); got != "alert-1" {
				t.Errorf("the %s request's %s is %q, want alert-1", h.header.Get(HeaderEventType), k, got)
			}
		}
		byType[h.header.Get(HeaderEventType)] = h
	}
	if len(rec.all()) != 2 || len(byType) != 2 {
		t.Fatalf("the target got %d requests of types %v, want one proxy and one alert.fired", len(rec.all()), byType)
	}
	if got := string(byType["proxy"].body); got != body {
		t.Errorf("proxied body %s, want the caller's %s", got, body)
	}
	var env struct {
		EventID string          `json:"event_id"`
		Data    json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(byType["alert.fired"].body, &env); err != nil || env.EventID != "alert-1" || string(env.Data) != `{"level":"high"}` {
		t.Errorf("event body %s (%v), want its envelope", byType["alert.fired"].body, err)
	}
	if r := q.row(t, proxied); !r.Proxied || r.EventID != "alert-1" {
		t.Errorf("proxied row reads %+v, want Proxied with the caller's id", r)
	}
}

func TestRedirectsAreNotFollowed(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/elsewhere" {
			w.WriteHeader(http.StatusOK)
			return
		}
		http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
	})
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL + "/hook", AllowPrivate: true, RetrySchedule: ms(3600000)}}, Options{})
	q.waitFor(t, 10*time.Second, "retrying", q.rowStatus(t, id, StatusRetrying))
	if as := q.attemptsOf(t, id); len(as) != 1 || as[0].StatusCode != http.StatusTemporaryRedirect {
		t.Errorf("attempts %v, want one 307", codes(as))
	}
	for _, h := range rec.all() {
		if h.path == "/elsewhere" {
			t.Errorf("the redirect was followed")
		}
	}
}

func TestSSRFRefusedTargetLogsClearError(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, status(http.StatusOK))
	_, port, _ := net.SplitHostPort(rec.srv.Listener.Addr().String())
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
	// A name passes CheckURL; the dial-time guard refuses what it resolves to.
	start(t, q, []Target{{Name: "crm", URL: "http://localhost:" + port + "/", RetrySchedule: ms(3600000)}}, Options{})
	q.waitFor(t, 10*time.Second, "the refused attempt", func() bool { return q.row(t, id).Attempts == 1 })
	a := q.attemptsOf(t, id)[0]
	if a.StatusCode != 0 || !strings.HasPrefix(a.Error, "refused: ") ||
		!strings.HasSuffix(a.Error, " is a loopback address (set allow_private on the target to allow)") {
		t.Errorf("attempt = %+v, want a clear loopback refusal", a)
	}
	if r := q.row(t, id); r.Status != StatusRetrying {
		t.Errorf("row status %s, want retrying (a connection error)", r.Status)
	}
	if n := len(rec.all()); n != 0 {
		t.Errorf("the server was reached %d times", n)
	}
}

func TestRedirectSendsOnceAndLeavesDeliveryUnchanged(t *testing.T) {
	t.Parallel()
	failing := newRecorder(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, "down")
	})
	inspector := newRecorder(t, func(_ int, w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "got it") })
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
	d := start(t, q, []Target{
		{Name: "crm", URL: failing.srv.URL, Secret: testSecret, AllowPrivate: true, RetrySchedule: []time.Duration{},
			Headers: map[string]string{"Authorization": "Bearer crm-credential"}},
	}, Options{})
	q.waitFor(t, 10*time.Second, "dead letter", q.rowStatus(t, id, StatusDeadLetter))
	before := q.row(t, id)
	if hits := failing.all(); len(hits) != 1 || hits[0].header.Get("Authorization") != "Bearer crm-credential" {
		t.Fatalf("the target got %d requests, want 1 with its Authorization header", len(hits))
	}

	a, err := d.Redirect(context.Background(), before, inspector.srv.URL+"/inspect")
	if err != nil {
		t.Fatalf("Redirect: %v", err)
	}
	if !a.Redirect || a.StatusCode != 200 || a.Body != "got it" || a.ID == 0 || a.URL != inspector.srv.URL+"/inspect" {
		t.Errorf("redirect attempt = %+v", a)
	}
	// The redirect took the next attempt number, which the row's count
	// moved to; nothing else of the row changed.
	if a.Attempt != before.Attempts+1 {
		t.Errorf("redirect numbered %d, want %d", a.Attempt, before.Attempts+1)
	}
	want := before
	want.Attempts++
	if after := q.row(t, id); !reflect.DeepEqual(after, want) {
		t.Errorf("row changed by a redirect:\n%+v\nwant\n%+v", after, want)
	}
	if hits := inspector.all(); len(hits) != 1 || hits[0].header.Get(HeaderDeliveryAttempt) != strconv.Itoa(a.Attempt) {
		t.Errorf("inspector got %d requests, want one numbered %d", len(hits), a.Attempt)
	}
	if hits := inspector.all(); len(hits) != 1 || hits[0].header.Get(HeaderEventID) != "evt_1" ||
		string(hits[0].body) != string(before.Payload) {
		t.Errorf("inspector got %d requests, want the payload once", len(hits))
	}
	// The target's headers are its credentials: a redirect, to any URL,
	// must not hand them over.
	if hits := inspector.all(); len(hits) == 1 && hits[0].header.Get("Authorization") != "" {
		t.Errorf("the redirect sent the target's Authorization header %q to the inspector", hits[0].header.Get("Authorization"))
	}
	if n := len(q.attemptsOf(t, id)); n != 2 {
		t.Errorf("%d attempts logged, want 2 (the failure and the redirect)", n)
	}
}

func TestRedirectToRefusedURL(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, status(http.StatusOK))
	_, port, _ := net.SplitHostPort(rec.srv.Listener.Addr().String())
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
	// Dead-letter it in the store: five failed attempts, the last a 500.
	for n := 1; n <= 5; n++ {
		out := Outcome{Status: StatusRetrying, NextAttemptAt: time.Now().Add(time.Hour)}
		if n == 5 {
			out = Outcome{Status: StatusDeadLetter}
		}
		q.recordAttempt(t, Attempt{DeliveryID: id, Target: "crm",
			URL: "https://crm.example.com/hook", Attempt: n, StatusCode: 500, RequestID: fmt.Sprint("req_", n), At: time.Now()}, out)
	}
	// Not started: Redirect needs no running worker.
	d, err := New(q, []Target{{Name: "crm", URL: "https://crm.example.com/hook"}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	row := q.row(t, id)
	urls := []string{"http://127.0.0.1:" + port, "http://[::1]:" + port, "http://[::ffff:127.0.0.1]:" + port,
		"http://169.254.169.254", "http://10.0.0.1", "http://100.64.0.1", "http://[fc00::1]", "http://0.0.0.0:" + port,
		"http://2130706433:" + port, "file:///etc/passwd", "http://localhost:" + port}
	for i, u := range urls {
		a, err := d.Redirect(context.Background(), row, u)
		if !errors.Is(err, ErrRefused) {
			t.Errorf("Redirect to %s: %v, want a refusal", u, err)
		}
		// Logged as an attempt, so numbered as one: after the five and
		// the refusals before it.
		if !a.Redirect || a.ID == 0 || !strings.HasPrefix(a.Error, "refused: ") || a.Attempt != 6+i {
			t.Errorf("Redirect to %s: attempt %+v, want a recorded refusal numbered %d", u, a, 6+i)
		}
	}
	// Only its attempt count moved, past the refusals.
	want := row
	want.Attempts += len(urls)
	if after := q.row(t, id); !reflect.DeepEqual(after, want) {
		t.Errorf("dead letter changed by refused redirects: %+v", after)
	}
	if n := len(rec.all()); n != 0 {
		t.Errorf("the server was reached %d times", n)
	}
	if _, err := d.Redirect(context.Background(), Row{ID: 9, Target: "nope"}, rec.srv.URL); err == nil {
		t.Errorf("Redirect for an unknown target: nil error")
	}
}

func TestWakeDeliversWithoutWaitingForThePoll(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, status(http.StatusOK))
	q := newStoreQueue(t)
	d := start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true}}, Options{Poll: time.Hour})
	q.waitFor(t, 10*time.Second, "the first pass", func() bool { return q.passesOf("crm") >= 1 })
	id := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
	d.Wake("crm")
	d.Wake("unknown") // ignored
	q.waitFor(t, 10*time.Second, "delivery after Wake", q.rowStatus(t, id, StatusDelivered))
}

func TestEachRetryIsSentWhenDueNotAtThePoll(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	q := newStoreQueue(t)
	first := q.add(t, "crm", "evt_1", "payment.succeeded", `{"id":"pay_1"}`)
	second := q.add(t, "crm", "evt_2", "payment.succeeded", `{"id":"pay_2"}`)
	// The first failure's retry comes due at -10% of the step, the
	// second's at +10%: a claim when the first is due does not take the
	// second, which must not wait for the poll.
	var draws atomic.Int64
	rnd := func() float64 {
		switch draws.Add(1) {
		case 1:
			return 0
		case 2:
			return 1
		}
		return 0.5
	}
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, RetrySchedule: ms(200)}},
		Options{Poll: time.Hour, Rand: rnd})

	q.waitFor(t, 10*time.Second, "both retried and delivered", func() bool {
		return q.row(t, first).Status == StatusDelivered && q.row(t, second).Status == StatusDelivered
	})
	if got := len(rec.all()); got != 4 {
		t.Errorf("target saw %d requests, want 4", got)
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, status(http.StatusNotFound))
	reg := prometheus.NewRegistry()
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true}}, Options{Registerer: reg})
	q.waitFor(t, 10*time.Second, "dead letter", q.rowStatus(t, id, StatusDeadLetter))
	counters := func() map[string]float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if c := m.GetCounter(); c != nil {
					got[mf.GetName()] += c.GetValue()
				}
			}
		}
		return got
	}
	// The counters move just after the attempt is recorded.
	q.waitFor(t, 10*time.Second, "the dead-letter counter", func() bool {
		return counters()["backstop_delivery_dead_letters_total"] >= 1
	})
	if got := counters(); got["backstop_delivery_attempts_total"] != 1 || got["backstop_delivery_dead_letters_total"] != 1 {
		t.Errorf("counters %v, want one attempt and one dead letter", got)
	}
}

func TestNewValidatesTargets(t *testing.T) {
	for _, tc := range []struct {
		name    string
		targets []Target
	}{
		{"no name", []Target{{URL: "https://example.com"}}},
		{"file URL", []Target{{Name: "a", URL: "file:///etc/passwd"}}},
		{"private literal", []Target{{Name: "a", URL: "http://10.0.0.1/"}}},
		{"bad secret", []Target{{Name: "a", URL: "https://example.com", Secret: "whsec_!!"}}},
		{"zero step", []Target{{Name: "a", URL: "https://example.com", RetrySchedule: []time.Duration{0}}}},
		{"negative concurrency", []Target{{Name: "a", URL: "https://example.com", Concurrency: -1}}},
		{"duplicate", []Target{{Name: "a", URL: "https://example.com"}, {Name: "a", URL: "https://example.org"}}},
	} {
		if _, err := New(newStoreQueue(t), tc.targets, Options{}); err == nil {
			t.Errorf("%s: New accepted %+v", tc.name, tc.targets)
		}
	}
	if _, err := New(newStoreQueue(t), []Target{{Name: "a", URL: "http://10.0.0.1/", AllowPrivate: true}}, Options{}); err != nil {
		t.Errorf("private literal with AllowPrivate: %v", err)
	}
}

// TestConcurrencySendsInParallelWithinItsBound: with Concurrency n (the
// target's own, over the dispatcher's 1), a target has up to n requests in
// flight at once, never more.
func TestConcurrencySendsInParallelWithinItsBound(t *testing.T) {
	t.Parallel()
	const (
		n    = 3
		rows = 12
	)
	var flight inFlight
	release := make(chan struct{})
	rec := newRecorder(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		defer flight.enter()()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusOK)
	})
	q := newStoreQueue(t)
	ids := make([]int64, rows)
	for i := range rows {
		ids[i] = q.add(t, "crm", fmt.Sprintf("evt_%d", i), "contact.created", `{"id":"ct_1"}`)
	}
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, Concurrency: n}}, Options{Concurrency: 1})
	q.waitFor(t, 10*time.Second, "n requests in flight", func() bool { return flight.now.Load() == n })
	close(release)
	for _, id := range ids {
		q.waitFor(t, 10*time.Second, "delivery", q.rowStatus(t, id, StatusDelivered))
	}
	if m := flight.most.Load(); m != n {
		t.Errorf("at most %d requests were in flight, want %d", m, n)
	}
}

// TestRetryAfterStopsSendsWithRequestsInFlight: with several requests in
// flight, a 429 lets those finish but starts no other request to the
// target before its Retry-After ends.
func TestRetryAfterStopsSendsWithRequestsInFlight(t *testing.T) {
	t.Parallel()
	const n = 4
	var inFlight atomic.Int32
	var answered atomic.Value // when the 429 was seen to be answered
	q := newStoreQueue(t)
	rec := newRecorder(t, func(k int, w http.ResponseWriter, r *http.Request) {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		if k == 1 {
			// Answer once all n slots are taken, so that the others are
			// in flight when the 429 arrives.
			deadline := time.Now().Add(5 * time.Second)
			for inFlight.Load() < n && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			answered.Store(time.Now())
			return
		}
		if k <= n {
			// Still in flight when the 429 lands: answer once the
			// dispatcher has stored the pause (it stops its senders first).
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
				st, err := q.db.TargetQueue(context.Background(), "crm", false)
				if err != nil || !st.PausedUntil.IsZero() {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("request %d: no pause stored in 10 s", k)
					break
				}
			}
		}
		w.WriteHeader(http.StatusOK)
	})
	var ids []int64
	for i := range 8 {
		ids = append(ids, q.add(t, "crm", fmt.Sprintf("evt_%d", i), "contact.created", `{"id":"ct_1"}`))
	}
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, RetrySchedule: ms(5, 5, 5, 5)}}, Options{Concurrency: n})
	for _, id := range ids {
		q.waitFor(t, 20*time.Second, "delivery", q.rowStatus(t, id, StatusDelivered))
	}
	at := answered.Load().(time.Time)
	hits := rec.all()
	if len(hits) != len(ids)+1 {
		t.Fatalf("%d requests, want %d (a 429, then every row once)", len(hits), len(ids)+1)
	}
	for i, h := range hits[n:] {
		if h.at.Before(at.Add(time.Second - 10*time.Millisecond)) {
			t.Errorf("request %d came %v after the 429, within its 1 s Retry-After", n+i+1, h.at.Sub(at))
		}
	}
}

// TestStopReleasesUnsentRows: when the dispatcher stops, the rows it
// claimed but did not send (the rest of its batch, and the batch it
// claimed ahead) are due again at once, not when their lease ends; the one
// in flight keeps its lease (it may have been delivered).
func TestStopReleasesUnsentRows(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 1)
	rec := newRecorder(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		<-r.Context().Done() // never answers
	})
	q := newStoreQueue(t)
	var ids []int64
	for i := range 5 {
		ids = append(ids, q.add(t, "crm", fmt.Sprintf("evt_%d", i), "contact.created", `{"id":"ct_1"}`))
	}
	d, err := New(q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true}}, Options{Poll: time.Hour, Lease: time.Hour, Batch: 2, StopGrace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	<-arrived
	// The batch after the first is claimed ahead while the first is sent.
	q.waitFor(t, 10*time.Second, "the claim ahead", func() bool {
		return q.row(t, ids[3]).ClaimedUntil.After(time.Now().Add(time.Minute))
	})
	stopped := time.Now()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	leased := 0
	for _, id := range ids {
		r := q.row(t, id)
		if r.Attempts != 0 || r.Status != StatusPending {
			t.Errorf("row %d = %+v, want pending and unattempted", id, r)
		}
		if r.ClaimedUntil.After(stopped.Add(time.Minute)) {
			leased++
		}
	}
	if leased != 1 {
		t.Errorf("%d rows still leased after the stop, want 1 (the one in flight)", leased)
	}
}

// fakeClock is a clock the test moves by hand, for Options.Now. It starts
// at the real time, so that rows queued before it are due.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}

func (c *fakeClock) now() time.Time           { return time.Unix(0, c.ns.Load()).UTC() }
func (c *fakeClock) advance(by time.Duration) { c.ns.Add(int64(by)) }

// TestNoRowSentAfterItsLease: a target that turns slow after a batch was
// claimed (each answer here takes 10 s of the test's clock, against a 60 s
// lease) does not get rows whose lease ran out, or has too little left for
// an attempt and its record, while they wait their turn, in the batch or
// in the one claimed ahead: such rows could be claimed again meanwhile
// (by the claim ahead, or another process) and be sent twice. Every event
// is sent exactly once, as attempt 1.
func TestNoRowSentAfterItsLease(t *testing.T) {
	t.Parallel()
	q := newStoreQueue(t)
	const rows = 16
	var ids []int64
	for i := range rows {
		ids = append(ids, q.add(t, "crm", fmt.Sprintf("evt_%d", i), "contact.created", `{"id":"ct_1"}`))
	}
	clock := newFakeClock() // after the rows were queued: they are due
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		// Each answer takes 10 s of the test's clock, within the 20 s
		// Timeout; the records of the answers before it take none (they
		// are committed before it).
		for deadline := time.Now().Add(10 * time.Second); q.deliveredOf("crm") < n-1; {
			if time.Now().After(deadline) {
				t.Errorf("request %d: the %d answers before it not recorded in 10 s", n, n-1)
				break
			}
			time.Sleep(time.Millisecond)
		}
		clock.advance(10 * time.Second)
		w.WriteHeader(http.StatusOK)
	})
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, Timeout: 20 * time.Second}},
		Options{Now: clock.now, Lease: time.Minute, Batch: 8})
	for _, id := range ids {
		q.waitFor(t, 20*time.Second, "delivery", q.rowStatus(t, id, StatusDelivered))
	}
	sent := map[string]int{}
	for _, h := range rec.all() {
		sent[h.header.Get(HeaderEventID)]++
		if got := h.header.Get(HeaderDeliveryAttempt); got != "1" {
			t.Errorf("%s sent as attempt %s, want 1", h.header.Get(HeaderEventID), got)
		}
	}
	for i := range rows {
		if n := sent[fmt.Sprintf("evt_%d", i)]; n != 1 {
			t.Errorf("evt_%d sent %d times, want once", i, n)
		}
	}
	for _, id := range ids {
		if r := q.row(t, id); r.Attempts != 1 {
			t.Errorf("row %d: %d attempts, want 1", id, r.Attempts)
		}
		if as := q.attemptsOf(t, id); len(as) != 1 {
			t.Errorf("row %d: %d attempts logged, want 1", id, len(as))
		}
	}
}

// TestRetryWhileInFlightIsRefused: a manual retry of a row whose attempt
// is in flight is refused (it would send the row again even when that
// attempt succeeds) and changes nothing: the attempt's outcome is
// recorded, and the row is sent once.
func TestRetryWhileInFlightIsRefused(t *testing.T) {
	t.Parallel()
	arrived, proceed := make(chan struct{}), make(chan struct{})
	rec := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			close(arrived)
			select {
			case <-proceed:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(http.StatusOK)
	})
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true}}, Options{})
	<-arrived
	if err := q.db.RetryDelivery(context.Background(), id, time.Now()); !errors.Is(err, backstop.ErrInFlight) {
		t.Errorf("retry while the attempt is in flight = %v, want ErrInFlight", err)
	}
	close(proceed)
	// A row queued after it is sent after it: a requeued evt_1 would go
	// out first.
	next := q.add(t, "crm", "evt_2", "contact.created", `{"id":"ct_2"}`)
	q.waitFor(t, 10*time.Second, "both delivered", func() bool {
		return q.row(t, id).Status == StatusDelivered && q.row(t, next).Status == StatusDelivered
	})
	if n := len(rec.all()); n != 2 {
		t.Errorf("the target got %d requests, want 2 (evt_1 once, evt_2 once)", n)
	}
	if as := q.attemptsOf(t, id); len(as) != 1 {
		t.Errorf("attempts %+v, want the one that was in flight", as)
	}
}

// TestRetryDuring429PauseIsRefused: a row a 429 answered stays claimed
// through the pause (the dispatcher sends it again itself when the pause
// ends), so a manual retry meanwhile is refused as for an attempt in
// flight: accepted, it would be sent once from memory and once more from
// the queue.
func TestRetryDuring429PauseIsRefused(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true}}, Options{})
	q.waitFor(t, 10*time.Second, "the 429 recorded", func() bool { return len(q.attemptsOf(t, id)) == 1 })
	if err := q.db.RetryDelivery(context.Background(), id, time.Now()); !errors.Is(err, backstop.ErrInFlight) {
		t.Errorf("retry during the 429's pause = %v, want ErrInFlight", err)
	}
	// A row queued after it is sent after it: a requeued evt_1 would go
	// out first.
	next := q.add(t, "crm", "evt_2", "contact.created", `{"id":"ct_2"}`)
	q.waitFor(t, 20*time.Second, "both delivered", func() bool {
		return q.row(t, id).Status == StatusDelivered && q.row(t, next).Status == StatusDelivered
	})
	if n := len(rec.all()); n != 3 {
		t.Errorf("the target got %d requests, want 3 (evt_1's 429 and its resend, evt_2)", n)
	}
}

// pacerFunc is a Pacer whose tickets tell done of every answer.
type pacerFunc struct{ done func(status int) }

func (p pacerFunc) Acquire(context.Context) (PaceTicket, error) { return p, nil }
func (p pacerFunc) Done(status int, _ http.Header)              { p.done(status) }
func (p pacerFunc) Abort()                                      {}

// TestRetryAfterStopsSendsBeforeItsBodyIsRead: with two requests in
// flight, a 429 stops new sends as soon as its status is in, not once its
// body has been read: an answer to the other request that lands while the
// 429's body is still coming does not let a new request go out within the
// pause.
func TestRetryAfterStopsSendsBeforeItsBodyIsRead(t *testing.T) {
	t.Parallel()
	seen := make(chan struct{}) // the dispatcher has the 429's status
	var seenOnce sync.Once
	third := make(chan struct{}) // a third request came
	var thirdOnce sync.Once
	var headersAt atomic.Value
	rec := newRecorder(t, func(k int, w http.ResponseWriter, r *http.Request) {
		switch {
		case k == 1:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			headersAt.Store(time.Now())
			w.(http.Flusher).Flush()
			// The body comes late: when a third request shows up (the
			// failure), or after a while.
			timer := time.NewTimer(1500 * time.Millisecond)
			defer timer.Stop()
			select {
			case <-third:
			case <-timer.C:
			case <-r.Context().Done():
			}
			io.WriteString(w, "slow down")
		case k == 2:
			select { // answered once the 429 is seen
			case <-seen:
			case <-time.After(10 * time.Second):
				t.Errorf("the 429 was not seen in 10 s")
			}
			w.WriteHeader(http.StatusOK)
		default:
			thirdOnce.Do(func() { close(third) })
			w.WriteHeader(http.StatusOK)
		}
	})
	q := newStoreQueue(t)
	var ids []int64
	for i := range 4 {
		ids = append(ids, q.add(t, "crm", fmt.Sprintf("evt_%d", i), "contact.created", `{"id":"ct_1"}`))
	}
	pacer := pacerFunc{done: func(status int) {
		if status == http.StatusTooManyRequests {
			seenOnce.Do(func() { close(seen) })
		}
	}}
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, Concurrency: 2}},
		Options{Pacers: map[string]Pacer{"crm": pacer}})
	for _, id := range ids {
		q.waitFor(t, 20*time.Second, "delivery", q.rowStatus(t, id, StatusDelivered))
	}
	at := headersAt.Load().(time.Time)
	for i, h := range rec.all()[2:] {
		if h.at.Before(at.Add(time.Second)) {
			t.Errorf("request %d came %v after the 429's status, within its 1 s Retry-After", i+3, h.at.Sub(at))
		}
	}
}

// TestQueueDepthMovesWhileABatchIsHeld: a worker holding its batch through
// a 429's pause makes no pass, yet the queue depth gauge still counts the
// rows queued meanwhile (it used to stay at its last count for the whole
// pause, up to the claim's lease).
func TestQueueDepthMovesWhileABatchIsHeld(t *testing.T) {
	t.Parallel()
	limited := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "10")
		w.WriteHeader(http.StatusTooManyRequests)
	})
	q := newStoreQueue(t)
	first := q.add(t, "limited", "evt_0", "contact.created", `{"id":"ct_0"}`)
	q.add(t, "limited", "evt_1", "contact.created", `{"id":"ct_1"}`)
	d := start(t, q, []Target{{Name: "limited", URL: limited.srv.URL, AllowPrivate: true}}, Options{})
	depth := func() float64 { return testutil.ToFloat64(d.byName["limited"].m.depth) }
	q.waitFor(t, 10*time.Second, "the 429", func() bool { return q.row(t, first).Attempts == 1 })
	if got := depth(); got != 2 {
		t.Fatalf("depth before the pause = %v, want 2", got)
	}
	for i := range 5 {
		q.add(t, "limited", fmt.Sprint("evt_more_", i), "contact.created", `{"id":"ct_2"}`)
	}
	q.waitFor(t, 8*time.Second, "a depth of 7 during the pause", func() bool { return depth() == 7 })
	if n := len(limited.all()); n != 1 {
		t.Errorf("%d requests to the paused target, want only the one answered 429", n)
	}
}

// startCounting queues three rows for crm and starts a dispatcher on clock,
// set an hour behind the rows' due time: they stay queued, and each pass
// only reads the state and claims nothing. It returns once the first pass
// has set the depth gauge (to 3), with a reader of the gauge.
func startCounting(t *testing.T, q *storeQueue, clock *fakeClock) (*Dispatcher, func() float64) {
	t.Helper()
	for i := range 3 {
		q.add(t, "crm", fmt.Sprint("evt_", i), "contact.created", `{"id":"ct_1"}`)
	}
	clock.advance(-time.Hour)
	d := start(t, q, []Target{{Name: "crm", URL: "https://crm.example.com/hook"}}, Options{Now: clock.now, Poll: time.Hour})
	depth := func() float64 { return testutil.ToFloat64(d.byName["crm"].m.depth) }
	q.waitFor(t, 10*time.Second, "a depth of 3 from the first pass", func() bool { return depth() == 3 })
	return d, depth
}

// TestQueueDepthCountedNowAndThen: the queue depth gauge counts the
// target's queued rows on the first pass, then at most every depthEvery,
// while every pass reads the target's state.
func TestQueueDepthCountedNowAndThen(t *testing.T) {
	t.Parallel()
	q := newStoreQueue(t)
	clock := newFakeClock()
	d, depth := startCounting(t, q, clock)
	for i := 3; i < 5; i++ {
		q.add(t, "crm", fmt.Sprint("evt_", i), "contact.created", `{"id":"ct_1"}`)
	}
	// Two more passes: the worker sets the gauge of one before it starts
	// the next.
	for range 2 {
		passes := q.passesOf("crm")
		d.Wake("crm")
		q.waitFor(t, 10*time.Second, "a pass within depthEvery", func() bool { return q.passesOf("crm") > passes })
	}
	if got := depth(); got != 3 {
		t.Errorf("depth counted again within depthEvery = %v, want 3 still", got)
	}
	clock.advance(depthEvery)
	d.Wake("crm")
	q.waitFor(t, 10*time.Second, "a depth of 5 after depthEvery", func() bool { return depth() == 5 })
}

// TestSlowQueueCountsAreSpacedOut: when counting the queue takes long (a
// long backlog), the next count waits depthCountShare times as long, so
// that the gauge does not cost the worker more than a small share of its
// time.
func TestSlowQueueCountsAreSpacedOut(t *testing.T) {
	t.Parallel()
	q := newStoreQueue(t)
	clock := newFakeClock()
	const countTakes = 100 * time.Millisecond
	q.onCount = func() { clock.advance(countTakes) }
	d, depth := startCounting(t, q, clock)
	q.add(t, "crm", "evt_3", "contact.created", `{"id":"ct_1"}`)
	pass := func() {
		t.Helper()
		passes := q.passesOf("crm")
		d.Wake("crm")
		q.waitFor(t, 10*time.Second, "a pass", func() bool { return q.passesOf("crm") > passes })
	}
	// depthEvery has passed, but not 50 × 100 ms.
	clock.advance(2 * depthEvery)
	pass()
	pass()
	if got := depth(); got != 3 {
		t.Errorf("depth counted again %v after a count that took %v: %v, want 3 still", 2*depthEvery, countTakes, got)
	}
	clock.advance(depthCountShare*countTakes - 2*depthEvery)
	d.Wake("crm")
	q.waitFor(t, 10*time.Second, "a depth of 4 once the spacing has passed", func() bool { return depth() == 4 })
}

// TestPausedTargetIgnoresWakes: while a target is paused (or disabled), the
// commits that queue rows for it do not make its worker read the store:
// nothing can be sent before the pause ends. Another target's worker
// answers every wake meanwhile.
func TestPausedTargetIgnoresWakes(t *testing.T) {
	t.Parallel()
	q := newStoreQueue(t)
	if err := q.db.PauseTarget(context.Background(), "billing", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	clock := newFakeClock()
	clock.advance(-time.Hour) // no row is due: passes only look
	d := start(t, q, []Target{
		{Name: "billing", URL: "https://billing.example.com/hook"},
		{Name: "crm", URL: "https://crm.example.com/hook"},
	}, Options{Now: clock.now, Poll: time.Hour})
	q.waitFor(t, 10*time.Second, "a first pass of each", func() bool { return q.passesOf("billing") > 0 && q.passesOf("crm") > 0 })
	paused := q.passesOf("billing")
	for range 20 {
		passes := q.passesOf("crm")
		d.Wake("billing")
		d.Wake("crm")
		q.waitFor(t, 10*time.Second, "a pass of crm", func() bool { return q.passesOf("crm") > passes })
	}
	if got := q.passesOf("billing"); got != paused {
		t.Errorf("the paused target's worker made %d passes on wakes, want none", got-paused)
	}
}

// slowPacer makes every request wait wait for its turn, as a target's
// rate-limit window would.
type slowPacer struct{ wait time.Duration }

func (p slowPacer) Acquire(ctx context.Context) (PaceTicket, error) {
	timer := time.NewTimer(p.wait)
	defer timer.Stop()
	select {
	case <-timer.C:
		return pacerFunc{done: func(int) {}}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestPacerWaitIsNotPartOfTheTimeout: the wait for a target's pacer is not
// taken from the request's Timeout (a wait longer than the Timeout used to
// fail the attempt before it was sent), and the attempt is stamped and
// signed when it is sent, not before the wait.
func TestPacerWaitIsNotPartOfTheTimeout(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, status(http.StatusOK))
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
	const wait = 1500 * time.Millisecond
	queued := time.Now()
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, Timeout: 500 * time.Millisecond}},
		// A lease with room for the wait: the row may be sent for 4.5 s
		// after its claim (Lease less Timeout and recordTimeout).
		Options{Pacers: map[string]Pacer{"crm": slowPacer{wait: wait}}, Lease: 15 * time.Second})
	q.waitFor(t, 20*time.Second, "delivery", q.rowStatus(t, id, StatusDelivered))
	atts := q.attemptsOf(t, id)
	if len(atts) != 1 || atts[0].StatusCode != http.StatusOK {
		t.Fatalf("attempts = %+v, want one answered 200", atts)
	}
	if !atts[0].At.After(queued.Add(wait - 100*time.Millisecond)) {
		t.Errorf("attempt stamped %v after queueing, before the pacer's %v wait ended", atts[0].At.Sub(queued), wait)
	}
}

// blockedPacer never lets a request go: Acquire waits until ctx ends.
type blockedPacer struct{ entered chan struct{} }

func (p blockedPacer) Acquire(ctx context.Context) (PaceTicket, error) {
	select {
	case p.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestStopWhileWaitingForThePacerReleasesTheRow: a row whose attempt was
// waiting for its target's pacer when the dispatcher stopped was never
// sent, so it is released (due at once after a restart), not left to its
// lease, and nothing is recorded for it.
func TestStopWhileWaitingForThePacerReleasesTheRow(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, status(http.StatusOK))
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
	pacer := blockedPacer{entered: make(chan struct{}, 1)}
	d, err := New(q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true}},
		Options{Pacers: map[string]Pacer{"crm": pacer}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	<-pacer.entered
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	r := q.row(t, id)
	if r.Status != StatusPending || r.Attempts != 0 || r.NextAttemptAt.After(time.Now()) {
		t.Errorf("row = %s, %d attempts, next at %v: want pending, unattempted and due now", r.Status, r.Attempts, r.NextAttemptAt)
	}
	if atts := q.attemptsOf(t, id); len(atts) != 0 {
		t.Errorf("attempts recorded: %+v, want none", atts)
	}
	if n := len(rec.all()); n != 0 {
		t.Errorf("%d requests reached the target, want 0", n)
	}
}

// twoDispatchersOnASlowTarget starts two dispatchers over one store (as
// two processes sharing the database would), each claiming batches of 12
// of a slow target's 40 rows (150 ms an answer). The target answers its
// 6th request, when both are inside their batches, with stop, and
// stoppedAt returns when it did (false before).
func twoDispatchersOnASlowTarget(t *testing.T, stop func(w http.ResponseWriter)) (rec *recorder, q *storeQueue, stoppedAt func() (time.Time, bool)) {
	t.Helper()
	var at atomic.Value
	rec = newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 6 {
			stop(w)
			at.Store(time.Now())
			return
		}
		time.Sleep(150 * time.Millisecond) // a slow target
		w.WriteHeader(http.StatusOK)
	})
	q = newStoreQueue(t)
	for i := range 40 {
		q.add(t, "crm", fmt.Sprintf("evt_%d", i), "contact.created", `{"id":"ct_1"}`)
	}
	targets := []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true}}
	start(t, q, targets, Options{Batch: 12})
	start(t, q, targets, Options{Batch: 12})
	return rec, q, func() (time.Time, bool) {
		t, ok := at.Load().(time.Time)
		return t, ok
	}
}

// TestPauseStoredByAnotherProcessStopsTheBatch: when one of two
// dispatchers sharing a store gets a 429, the other stops sending its
// batch within stateEvery and an answer, not only at its next claim: no
// request reaches the target from 1 s after the 429 until its
// Retry-After (3 s) ends.
func TestPauseStoredByAnotherProcessStopsTheBatch(t *testing.T) {
	t.Parallel()
	rec, q, limitedAt := twoDispatchersOnASlowTarget(t, func(w http.ResponseWriter) {
		w.Header().Set("Retry-After", "3")
		w.WriteHeader(http.StatusTooManyRequests)
	})
	q.waitFor(t, 20*time.Second, "a request after the pause", func() bool {
		at, ok := limitedAt()
		if !ok {
			return false
		}
		for _, h := range rec.all() {
			if h.at.After(at.Add(2900 * time.Millisecond)) {
				return true
			}
		}
		return false
	})
	at, _ := limitedAt()
	for _, h := range rec.all() {
		if d := h.at.Sub(at); d > time.Second && d < 2900*time.Millisecond {
			t.Errorf("a request came %v after the 429, within its 3 s Retry-After", d)
		}
	}
}

// TestGoneStoredByAnotherProcessStopsTheBatch: as above for a 410: once
// one dispatcher has disabled the target, the other stops sending its
// batch within stateEvery and an answer.
func TestGoneStoredByAnotherProcessStopsTheBatch(t *testing.T) {
	t.Parallel()
	rec, q, goneAt := twoDispatchersOnASlowTarget(t, func(w http.ResponseWriter) {
		w.WriteHeader(http.StatusGone)
	})
	// Watch the target for 2 s after the 410 (the unfixed dispatcher sent
	// the rest of its batch, about 1.4 s of it).
	q.waitFor(t, 20*time.Second, "2 s after the 410", func() bool {
		at, ok := goneAt()
		return ok && time.Since(at) > 2*time.Second
	})
	at, _ := goneAt()
	for _, h := range rec.all() {
		if d := h.at.Sub(at); d > time.Second {
			t.Errorf("a request came %v after the 410", d)
		}
	}
}

// TestStopLetsAttemptsInFlightFinish: when Run's ctx ends while a request
// is in flight, the request is answered and recorded within the stop
// grace (so a restart does not send it again), no new attempt starts, and
// the rows not sent are released; past the grace the request is cut short
// and its row left to its lease.
func TestStopLetsAttemptsInFlightFinish(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		grace     time.Duration
		delivered bool
	}{
		{"within the grace", 5 * time.Second, true},
		{"past the grace", 100 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			arrived := make(chan struct{}, 1)
			release := make(chan struct{})
			rec := newRecorder(t, func(n int, w http.ResponseWriter, r *http.Request) {
				arrived <- struct{}{}
				select { // answered once the dispatcher is told to stop
				case <-release:
				case <-r.Context().Done():
					return
				}
				w.WriteHeader(http.StatusOK)
			})
			q := newStoreQueue(t)
			first := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
			second := q.add(t, "crm", "evt_2", "contact.created", `{"id":"ct_2"}`)
			d, err := New(q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true}},
				Options{Poll: time.Hour, StopGrace: tc.grace})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- d.Run(ctx) }()
			<-arrived
			cancel()
			if tc.delivered {
				close(release)
			}
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}
			if !tc.delivered {
				close(release)
			}
			r := q.row(t, first)
			switch {
			case tc.delivered && (r.Status != StatusDelivered || len(q.attemptsOf(t, first)) != 1):
				t.Errorf("row in flight = %s with %d attempts, want delivered with 1", r.Status, len(q.attemptsOf(t, first)))
			case !tc.delivered && (r.Status != StatusPending || len(q.attemptsOf(t, first)) != 0 || !r.ClaimedUntil.After(time.Now())):
				t.Errorf("row cut short = %s with %d attempts, claimed until %v: want pending, unrecorded and leased", r.Status, len(q.attemptsOf(t, first)), r.ClaimedUntil)
			}
			if r := q.row(t, second); r.Status != StatusPending || r.Attempts != 0 || r.NextAttemptAt.After(time.Now()) || !r.ClaimedUntil.IsZero() {
				t.Errorf("row not sent = %s, %d attempts, next at %v, claimed until %v: want pending and released", r.Status, r.Attempts, r.NextAttemptAt, r.ClaimedUntil)
			}
			if n := len(rec.all()); n != 1 {
				t.Errorf("%d requests reached the target, want 1", n)
			}
		})
	}
}

// TestBacklogIsSentWithoutWaitingForThePoll queues more rows than the
// first claims take (a worker claims firstBatch rows until it has timed its
// target) and checks that all are sent at once: a batch claimed ahead with
// the smaller first limit must lead to the next claim, not to a wait for
// the next poll (an hour here).
func TestBacklogIsSentWithoutWaitingForThePoll(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, status(http.StatusOK))
	q := newStoreQueue(t)
	const rows = 5 * firstBatch
	for i := range rows {
		q.add(t, "crm", fmt.Sprintf("evt_%d", i), "contact.created", fmt.Sprintf(`{"id":"ct_%d"}`, i))
	}
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true}}, Options{Poll: time.Hour})
	q.waitFor(t, 10*time.Second, fmt.Sprintf("%d deliveries", rows), func() bool { return q.deliveredOf("crm") == rows })
}

func TestRequestIDsAreNewRandomUUIDs(t *testing.T) {
	t.Parallel()
	g := newRequestIDs()
	seen := map[string]bool{}
	for range 1000 {
		s := g.next()
		id, err := uuid.Parse(s)
		if err != nil || id.Version() != 4 || id.Variant() != uuid.RFC4122 || id.String() != s {
			t.Fatalf("request id %q: not a random (version 4) UUID in canonical form (%v)", s, err)
		}
		if seen[s] {
			t.Fatalf("request id %q repeated", s)
		}
		seen[s] = true
	}
}

// Run's keep-alive connections to the targets end with it: they stayed
// open until they had idled 90 s, and a target (or a benchmark running
// the dispatcher again and again) kept a connection and its goroutine per
// worker of every run that had ended.
func TestRunClosesItsConnectionsWhenItEnds(t *testing.T) {
	t.Parallel()
	var open atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "payment.succeeded", `{"id":"pay_1"}`)
	d, err := New(q, []Target{{Name: "crm", URL: srv.URL, AllowPrivate: true}}, Options{Poll: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	q.waitFor(t, 10*time.Second, "delivery", q.rowStatus(t, id, StatusDelivered))
	if n := open.Load(); n != 1 {
		t.Fatalf("%d connections open to the target while the dispatcher runs, want its one keep-alive connection", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for open.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open to the target 5 s after Run returned", open.Load())
		}
		time.Sleep(10 * time.Millisecond) // polling the server's count, with a deadline
	}
}
