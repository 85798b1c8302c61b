package intake_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/store"
)

// answerBeforeBody sends head, announcing a body of 100 bytes, and then
// only its first byte, and reads the answer, waiting at most 5 s for it.
func answerBeforeBody(t *testing.T, url, head string) *http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "%sContent-Length: 100\r\n\r\n{", head)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer while the body was still to come: %v", err)
	}
	return res
}

// wantRefusal checks res's status and JSON error code, and that the
// answer ends its connection (the rest of the body is never read).
func wantRefusal(t *testing.T, res *http.Response, status int, code string) {
	t.Helper()
	body, _ := io.ReadAll(res.Body)
	var msg struct {
		Error struct{ Code, Message string }
	}
	if res.StatusCode != status || json.Unmarshal(body, &msg) != nil || msg.Error.Code != code || msg.Error.Message == "" {
		t.Errorf("answered %d %s, want %d with a JSON %s error", res.StatusCode, body, status, code)
	}
	if !res.Close {
		t.Error("the answer keeps the connection open with the body unread")
	}
}

// A refusal that needs no body (wrong method, not JSON) is answered at
// once, even while the body is still to come: net/http used to read the
// rest of the body before sending it, and a sender whose body was slow or
// cut short got nothing until the server's read timeout (30 s in serve).
func TestRefusalsBeforeTheBodyAreAnsweredAtOnce(t *testing.T) {
	e := newIntakeWith(t, intake.HandlerOptions{}, func(s *http.Server) {
		s.ReadTimeout, s.WriteTimeout = time.Minute, time.Minute
	})
	for _, c := range []struct {
		name, head string
		status     int
		code       string
	}{
		{"wrong method", "PUT / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n", http.StatusMethodNotAllowed, "method_not_allowed"},
		{"not JSON", "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n", http.StatusUnsupportedMediaType, "unsupported_media_type"},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantRefusal(t, answerBeforeBody(t, e.srv.URL, c.head), c.status, c.code)
		})
	}
	if e.processed() != 0 {
		t.Error("a refused request was stored")
	}
}

// The same for the webhook proxy's refusals before the body: a wrong
// token, an unknown target, the wrong method, and an address locked out
// after too many wrong tokens.
func TestProxyRefusalsBeforeTheBodyAreAnsweredAtOnce(t *testing.T) {
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "p.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mux := http.NewServeMux()
	mux.Handle("/outbox/{target}", intake.NewProxy(db, intake.ProxyOptions{Token: "proxy-token", Targets: []string{"crm"}}))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.ReadTimeout, srv.Config.WriteTimeout = time.Minute, time.Minute
	srv.Start()
	t.Cleanup(srv.Close) // after the connections' (answerBeforeBody)
	const auth = "Authorization: Bearer proxy-token\r\nContent-Type: application/json\r\n"
	for _, c := range []struct {
		name, head string
		status     int
		code       string
	}{
		{"unknown target", "POST /outbox/nope HTTP/1.1\r\nHost: x\r\n" + auth, http.StatusNotFound, "unknown_target"},
		{"wrong method", "PUT /outbox/crm HTTP/1.1\r\nHost: x\r\n" + auth, http.StatusMethodNotAllowed, "method_not_allowed"},
		{"wrong token", "POST /outbox/crm HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer guessed\r\n", http.StatusUnauthorized, "unauthorized"},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantRefusal(t, answerBeforeBody(t, srv.URL, c.head), c.status, c.code)
		})
	}
	for range intake.MaxAuthFailures {
		answerBeforeBody(t, srv.URL, "POST /outbox/crm HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer guessed\r\n").Body.Close()
	}
	wantRefusal(t, answerBeforeBody(t, srv.URL, "POST /outbox/crm HTTP/1.1\r\nHost: x\r\n"+auth), http.StatusTooManyRequests, "too_many_failures")
	if rows, err := db.OutboxRows(context.Background(), "crm"); err != nil || len(rows) != 0 {
		t.Errorf("queued from a refused request: %v %+v", err, rows)
	}
}

// The bearer scheme's name is case-insensitive (RFC 9110), as the
// dashboard already took it: "bearer" was refused and counted as a wrong
// token.
func TestProxyBearerSchemeAnyCase(t *testing.T) {
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "p.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mux := http.NewServeMux()
	mux.Handle("/outbox/{target}", intake.NewProxy(db, intake.ProxyOptions{Token: "proxy-token", Targets: []string{"crm"}}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for i, scheme := range []string{"bearer", "BEARER", "Bearer"} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/outbox/crm", strings.NewReader(`{"n":1}`))
		req.Header.Set("Authorization", scheme+" proxy-token")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", fmt.Sprint("k", i))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusAccepted {
			t.Errorf("Authorization: %s …: %d, want 202", scheme, res.StatusCode)
		}
	}
}
