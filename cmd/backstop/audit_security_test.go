package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/backstop-sync/backstop/sinks/intake"
)

// proxyTokenPost POSTs a JSON payload to serve's /outbox/billing with the
// given bearer token and returns the answer's status, Retry-After and
// body.
func proxyTokenPost(t *testing.T, addr, token, eventID string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/outbox/billing", strings.NewReader(`{"n":1}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("X-Event-Id", eventID)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header.Get("Retry-After"), string(b)
}

// The webhook proxy's bearer token cannot be guessed at network speed:
// /outbox/{target} listens where the platform's webhooks come in, so it
// is as exposed as the intake. After intake.MaxAuthFailures wrong tokens
// from one address, that address is answered 429 with Retry-After, even
// with the right token (else the answer would still tell a right guess),
// and nothing is queued.
func TestProxyLimitsWrongTokensPerAddress(t *testing.T) {
	s := startServe(t)
	for i := range intake.MaxAuthFailures {
		if code, _, body := proxyTokenPost(t, s.addr, fmt.Sprint("guess-", i), fmt.Sprint("evt_guess_", i)); code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d %s, want 401", i+1, code, body)
		}
	}
	code, retryAfter, body := proxyTokenPost(t, s.addr, proxyToken, "evt_right_token")
	if code != http.StatusTooManyRequests || retryAfter == "" || !strings.Contains(body, `"too_many_failures"`) {
		t.Fatalf("right token after %d wrong ones: %d Retry-After %q %s; want 429 too_many_failures with Retry-After",
			intake.MaxAuthFailures, code, retryAfter, body)
	}
	db := s.e.openStore()
	defer db.Close()
	rows, err := db.OutboxRows(context.Background(), "billing")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 0 {
		t.Errorf("%d deliveries queued by a blocked address, want none", len(rows))
	}
}
