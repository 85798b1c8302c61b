package intake_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

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
