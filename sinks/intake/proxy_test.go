package intake_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/internal/syncbuf"
	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/store"
)

func TestProxyQueuesDurablyAndRefusesBadCalls(t *testing.T) {
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "p.db"), store.Options{Synchronous: "FULL"})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	woken := make(chan string, 10)
	mux := http.NewServeMux()
	mux.Handle("/outbox/{target}", intake.NewProxy(db, intake.ProxyOptions{
		Token: "proxy-token", Targets: []string{"discord"}, OnQueued: func(t string) { woken <- t },
		MaxPayload: map[string]int{"discord": 2000},
	}))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	post := func(target, token, body string, header map[string]string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/outbox/"+target, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	// Over the target's max_payload: a proxied body goes out as it came,
	// so it is refused rather than cut.
	big := `{"content":"` + strings.Repeat("z", 2000) + `"}`
	if code, resp := post("discord", "proxy-token", big, map[string]string{"X-Event-Id": "alert-big"}); code != http.StatusRequestEntityTooLarge ||
		!strings.Contains(resp, "body of 2014 bytes is over target discord's max_payload of 2000 bytes") {
		t.Errorf("a body over the target's max_payload: %d %s, want 413 naming it", code, resp)
	}
	body := `{"content":"deploy finished ✅"}`
	code, resp := post("discord", "proxy-token", body, map[string]string{"X-Event-Id": "alert-1"})
	if code != 202 || !strings.Contains(resp, `"queued"`) {
		t.Fatalf("queue: %d %s", code, resp)
	}
	if <-woken != "discord" {
		t.Error("the target's worker was not woken")
	}
	// The same call again (a retrying caller) is queued once.
	if code, _ := post("discord", "proxy-token", body, map[string]string{"X-Event-Id": "alert-1"}); code != 202 {
		t.Fatalf("repeat: %d", code)
	}
	// The same key with another body is refused: it answered 202 and the
	// new body was silently never delivered.
	code, resp = post("discord", "proxy-token", `{"content":"deploy failed"}`, map[string]string{"Idempotency-Key": "alert-1"})
	if code != http.StatusConflict || !strings.Contains(resp, `"key_reused"`) || !strings.Contains(resp, `Idempotency-Key \"alert-1\" was already queued for discord`) {
		t.Errorf("the key again with another body: %d %s; want 409 key_reused", code, resp)
	}
	rows, err := db.OutboxRows(context.Background(), "discord")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Status != "pending" || !bytes.Equal(rows[0].Payload, []byte(body)) {
		t.Fatalf("outbox: %+v", rows)
	}
	for _, c := range []struct {
		name, target, token, body string
		want                      int
	}{
		{"unknown target", "slack", "proxy-token", body, 404},
		{"bad token", "discord", "nope", body, 401},
		{"no token", "discord", "", body, 401},
		{"not JSON", "discord", "proxy-token", "hello", 400},
		{"too large", "discord", "proxy-token", `{"x":"` + strings.Repeat("a", 70<<10) + `"}`, 413},
	} {
		if code, resp := post(c.target, c.token, c.body, nil); code != c.want || !strings.Contains(resp, `"message"`) {
			t.Errorf("%s: %d %s, want %d with a JSON message", c.name, code, resp, c.want)
		}
	}
	if rows, _ := db.OutboxRows(context.Background(), ""); len(rows) != 1 {
		t.Errorf("refused calls stored rows: %d", len(rows))
	}
}

// proxyOver serves the webhook proxy over db for targets, and returns a
// function that posts body to /outbox/{target} with the right token and
// header, and returns the status and the decoded JSON answer.
func proxyOver(t *testing.T, db *store.DB, targets ...string) func(target, body string, header map[string]string) (int, map[string]any) {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/outbox/{target}", intake.NewProxy(db, intake.ProxyOptions{Token: "proxy-token", Targets: targets}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return func(target, body string, header map[string]string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/outbox/"+target, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer proxy-token")
		for k, v := range header {
			req.Header[http.CanonicalHeaderKey(k)] = []string{v} // as sent, not checked by the client
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var answer map[string]any
		if err := json.NewDecoder(res.Body).Decode(&answer); err != nil {
			t.Fatalf("answer %d is not JSON: %v", res.StatusCode, err)
		}
		return res.StatusCode, answer
	}
}

// The repro of the audit: the webhook proxy and the intake share no ids. A
// webhook whose event_id a proxy call used already is still queued for the
// targets that take it, and a proxy call with the id of a queued event is
// queued with its own body; repeats of the call are still one row.
func TestProxyAndWebhooksNeverTakeEachOthersRow(t *testing.T) {
	e := newIntake(t, nil)
	post := proxyOver(t, e.db, "billing")
	ctx := context.Background()
	rowOf := func(id any) store.OutboxRow {
		t.Helper()
		n, ok := id.(float64)
		if !ok {
			t.Fatalf("answer id %v", id)
		}
		r, ok, err := e.db.Delivery(ctx, int64(n))
		if err != nil || !ok {
			t.Fatalf("delivery %v: %v %v", id, ok, err)
		}
		return r
	}

	code, answer := post("billing", `{"note":"first"}`, map[string]string{"X-Event-Id": "evt_future"})
	if code != http.StatusAccepted || answer["event_id"] != "evt_future" {
		t.Fatalf("proxy call: %d %v", code, answer)
	}
	proxied := rowOf(answer["id"])
	if code, resp := e.post(paymentEvent("evt_future", "pay_1", "2026-01-01T00:00:00Z", "succeeded"), nil); code != http.StatusOK || !strings.Contains(resp, "accepted") {
		t.Fatalf("webhook: %d %s", code, resp)
	}
	rows, err := e.db.OutboxRows(ctx, "billing")
	if err != nil {
		t.Fatal(err)
	}
	var eventRow *store.OutboxRow
	for i, r := range rows {
		if r.ID != proxied.ID && r.EventType == "payment.succeeded" {
			eventRow = &rows[i]
		}
	}
	if len(rows) != 2 || eventRow == nil || eventRow.EventID != "evt_future" ||
		!strings.HasPrefix(string(eventRow.Payload), `{"event_id":"evt_future",`) {
		t.Fatalf("billing's outbox after the webhook: %+v, want the proxied payload and the event", rows)
	}

	if code, _ := e.post(paymentEvent("evt_past", "pay_2", "2026-01-01T00:00:00Z", "succeeded"), nil); code != http.StatusOK {
		t.Fatalf("webhook: %d", code)
	}
	for range 2 { // the call and its repeat
		code, answer = post("billing", `{"note":"second"}`, map[string]string{"X-Event-Id": "evt_past"})
		if code != http.StatusAccepted || answer["event_id"] != "evt_past" {
			t.Fatalf("proxy call with a queued event's id: %d %v", code, answer)
		}
		if r := rowOf(answer["id"]); r.EventType != "proxy" || string(r.Payload) != `{"note":"second"}` || r.EventID != "evt_past" {
			t.Fatalf("proxy call with a queued event's id got row %+v, not its own", r)
		}
	}
	if rows, _ := e.db.OutboxRows(ctx, "billing"); len(rows) != 4 {
		t.Errorf("billing has %d rows, want 4 (two events, two proxied payloads)", len(rows))
	}
}

// The proxy refuses what is not UTF-8, in the body and in the ids, and
// checks ids with the intake's rule (C1 controls included), answering 400
// with a message that says what is wrong; nothing is queued.
func TestProxyRefusesInvalidUTF8AndBadIDs(t *testing.T) {
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "p.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	post := proxyOver(t, db, "ok")
	for _, c := range []struct {
		name, body string
		header     map[string]string
		code, want string // the error's code, and what its message says
	}{
		{"body not UTF-8", "{\"a\":\"\xff\xfe\"}", nil, "malformed_json", "byte 6 (0xff) is not valid UTF-8"},
		{"X-Event-Id not UTF-8", `{}`, map[string]string{"X-Event-Id": "px\xff\xfe"}, "bad_event_id", "X-Event-Id is not valid UTF-8"},
		{"X-Event-Id with a C1 control", `{}`, map[string]string{"X-Event-Id": "px\u0085"}, "bad_event_id", "X-Event-Id contains a control character (U+0085)"},
		{"X-Event-Id with U+FFFD", `{}`, map[string]string{"X-Event-Id": "px\ufffd"}, "bad_event_id", "X-Event-Id contains U+FFFD"},
		{"Idempotency-Key with a C1 control", `{}`, map[string]string{"Idempotency-Key": "k\u009f"}, "bad_event_id", "Idempotency-Key contains a control character (U+009F)"},
		{"X-Event-Id too long", `{}`, map[string]string{"X-Event-Id": strings.Repeat("a", 201)}, "bad_event_id", "X-Event-Id is 201 bytes long"},
		{"X-Event-Type not UTF-8", `{}`, map[string]string{"X-Event-Type": "t\xff"}, "bad_event_type", "X-Event-Type is not valid UTF-8"},
	} {
		code, answer := post("ok", c.body, c.header)
		e, _ := answer["error"].(map[string]any)
		msg, _ := e["message"].(string)
		if code != http.StatusBadRequest || e["code"] != c.code || !strings.Contains(msg, c.want) {
			t.Errorf("%s: %d %v, want 400 %s saying %q", c.name, code, answer, c.code, c.want)
		}
	}
	if rows, err := db.OutboxRows(context.Background(), ""); err != nil {
		t.Fatal(err)
	} else if len(rows) != 0 {
		t.Errorf("refused calls queued %d rows: %+v", len(rows), rows)
	}
	// Ids the intake takes are taken, and reported as sent.
	for _, id := range []string{"ünïcode-ok ✅", "evt_1 with spaces"} {
		if code, answer := post("ok", `{"a":"é"}`, map[string]string{"X-Event-Id": id}); code != http.StatusAccepted || answer["event_id"] != id {
			t.Errorf("X-Event-Id %q: %d %v", id, code, answer)
		}
	}
}

// A proxied body that arrives too slowly is answered 408 JSON, even once
// the server's own read and write timeouts have passed, and nothing is
// queued.
func TestProxySlowBodyGets408(t *testing.T) {
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "p.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mux := http.NewServeMux()
	mux.Handle("/outbox/{target}", intake.NewProxy(db, intake.ProxyOptions{
		Token: "proxy-token", Targets: []string{"discord"}, BodyTimeout: 2 * time.Second,
	}))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.ReadTimeout, srv.Config.WriteTimeout = time.Second, time.Second // as serve's, equal and shorter than the body's
	srv.Start()
	defer srv.Close()

	body := []byte(`{"content":"a slow alert"}`)
	sendSlowly(t, srv.URL, fmt.Sprintf("POST /outbox/discord HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer proxy-token\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body)), body, true)
	if rows, err := db.OutboxRows(context.Background(), "discord"); err != nil || len(rows) != 0 {
		t.Errorf("queued from a body that never arrived: %v %+v", err, rows)
	}
}

// Each wrong bearer token used to write a warning: the lines are now at
// most one a second, the next one saying how many were not logged.
func TestProxyWrongTokensAreLoggedAtMostOnceASecond(t *testing.T) {
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "proxy.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var logs syncbuf.Buffer
	clock := &testClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	mux := http.NewServeMux()
	mux.Handle("/outbox/{target}", intake.NewProxy(db, intake.ProxyOptions{Token: "proxy-token", Targets: []string{"crm"},
		Now: clock.Now, Logger: slog.New(slog.NewTextHandler(&logs, nil))}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	post := func() int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/outbox/crm", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer guessed")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	for i := range intake.MaxAuthFailures {
		if code := post(); code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i+1, code)
		}
	}
	if n := strings.Count(logs.String(), "wrong bearer token"); n != 1 {
		t.Fatalf("%d warnings for %d wrong tokens within a second, want 1:\n%s", n, intake.MaxAuthFailures, logs.String())
	}
	clock.Add(intake.AuthFailureWindow)
	if code := post(); code != http.StatusUnauthorized {
		t.Fatalf("wrong token after the window: %d, want 401", code)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	want := fmt.Sprintf("not_logged_since_last=%d", intake.MaxAuthFailures-1)
	if len(lines) != 2 || !strings.Contains(lines[1], want) {
		t.Errorf("after the window: %d lines, want 2, the last saying %s:\n%s", len(lines), want, logs.String())
	}
}
