package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sinks/intake"
	"github.com/backstop-sync/backstop/store"
)

// An accepted webhook is sent on to its target at once: serve's intake
// wakes the target's worker after the commit that queued the row. The
// dispatcher here polls once an hour, so only that wake can deliver it
// within the test's deadline.
func TestAcceptedWebhookIsDeliveredWithoutWaitingForThePoll(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, err := store.Open(ctx, filepath.Join(t.TempDir(), "w.db"), store.Options{Synchronous: "FULL"})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	dispatcher, got := hourlyDispatcher(t, db)
	log := slog.New(slog.DiscardHandler)

	const secret = "wake-secret"
	verifier, err := intake.NewVerifier(intake.SchemeBotix, intake.SchemeOptions{Secrets: []string{secret}})
	if err != nil {
		t.Fatal(err)
	}
	routes := []backstop.Route{{Target: "billing", Events: []string{"payment.*"}}}
	stack := startIntake(ctx, db, nil, verifier, intakeOptions{routes: routes, onQueued: dispatcher.Wake}, log, prometheus.NewRegistry())
	defer stack.stop(context.Background())
	srv := httptest.NewServer(stack.handler)
	defer srv.Close()

	for i := range 3 {
		id := fmt.Sprintf("evt_wake_%d", i)
		at := time.Now().UTC().Format(time.RFC3339Nano)
		body := fmt.Appendf(nil, `{"event_id":%q,"event":"payment.succeeded","created_at":%q,"data":{"id":"pay_%d","updated_at":%q}}`, id, at, i, at)
		if code, answer := postSigned(t, srv.URL, secret, body); code != http.StatusOK {
			t.Fatalf("webhook %s: %d %s", id, code, answer)
		}
		select {
		case seen := <-got:
			if seen != id {
				t.Fatalf("target got %s, want %s", seen, id)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("webhook %s accepted but not delivered after 30 s (the dispatcher polls hourly)", id)
		}
	}
}

// postSigned POSTs body to url signed with the botix scheme and returns the
// status code and the answer's body.
func postSigned(t *testing.T, url, secret string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Botix-Signature", intake.SignBotix(secret, body))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	answer, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, answer
}
