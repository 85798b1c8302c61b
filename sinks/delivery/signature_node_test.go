package delivery

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sinks/intake"
)

// nodeDir holds verify.js and the lock file of the npm standardwebhooks
// package; `make test` installs it with npm ci.
const nodeDir = "testdata/node"

// nodeVerifier returns the path of node after checking that the
// standardwebhooks module is installed. It fails the test, never skips it:
// the independent check is part of what the tests must show.
func nodeVerifier(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not on PATH (%v): install Node.js and run `make test`, which installs the npm standardwebhooks package the signature check needs", err)
	}
	if _, err := os.Stat(filepath.Join(nodeDir, "node_modules", "standardwebhooks", "package.json")); err != nil {
		t.Fatalf("the npm standardwebhooks package is not installed in sinks/delivery/%s (%v): run `make test`, or `npm ci --prefix sinks/delivery/%s --no-audit --no-fund`", nodeDir, err, nodeDir)
	}
	return node
}

// verifyWithNode runs verify.js on one request; it returns nil when
// standardwebhooks accepts the signature, and the script's reason when it
// rejects it. Any other failure (node crashing, bad input) fails the test.
func verifyWithNode(t *testing.T, node, secret string, header http.Header, body []byte) error {
	t.Helper()
	headers := make(map[string]string, len(header))
	for k := range header {
		headers[k] = header.Get(k)
	}
	in, err := json.Marshal(map[string]any{"secret": secret, "headers": headers, "body_base64": body})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "verify.js")
	cmd.Dir = nodeDir
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &exit) && exit.ExitCode() == 1:
		return errors.New(strings.TrimSpace(stderr.String()))
	default:
		t.Fatalf("node verify.js: %v: %s", err, stderr.String())
		return nil
	}
}

func TestSignaturesVerifyWithNodeStandardWebhooks(t *testing.T) {
	t.Parallel()
	node := nodeVerifier(t)
	signed := newRecorder(t, status(http.StatusNoContent))
	q := newStoreQueue(t)
	ids := []int64{
		q.add(t, "signed", "evt_small", "payment.succeeded", `{"id":"pay_1","amount":100,"note":"café ✓ <&>"}`),
		// Over MaxPayload: the body sent and signed is the cut envelope.
		q.emit(t, "signed", "evt_big", "note.created", fmt.Sprintf(`{"id":"msg_1","text":%q}`, strings.Repeat("a", 500))),
	}
	start(t, q, []Target{{Name: "signed", URL: signed.srv.URL, Secret: testSecret, AllowPrivate: true, MaxPayload: 300}}, Options{})
	for _, id := range ids {
		q.waitFor(t, 10*time.Second, "delivery", q.rowStatus(t, id, StatusDelivered))
	}

	hits := signed.all()
	if len(hits) != len(ids) {
		t.Fatalf("signed target got %d requests, want %d", len(hits), len(ids))
	}
	for _, h := range hits {
		id := h.header.Get(HeaderEventID)
		if err := verifyWithNode(t, node, testSecret, h.header, h.body); err != nil {
			t.Errorf("%s: standardwebhooks rejects the signature: %v", id, err)
		}
		tampered := bytes.Replace(h.body, []byte(`"id":"`), []byte(`"id":"x`), 1)
		if bytes.Equal(tampered, h.body) {
			t.Fatalf("%s: could not tamper with body %s", id, h.body)
		}
		if err := verifyWithNode(t, node, testSecret, h.header, tampered); err == nil {
			t.Errorf("%s: standardwebhooks accepts a tampered body", id)
		}
		if err := verifyWithNode(t, node, "whsec_"+"QmFja3N0b3Agb3RoZXIgc2VjcmV0IGtleQ==", h.header, h.body); err == nil {
			t.Errorf("%s: standardwebhooks accepts the signature under another secret", id)
		}
	}
}

// An event id or type that is not printable ASCII, or has spaces at its
// ends, is sent percent-encoded in webhook-id, X-Event-Id and X-Event-Type,
// and signed so: header values are read as Latin-1 by Node and Python, and
// trimmed by every parser, so the raw id left the signature unverifiable
// (standardwebhooks: "No matching signature found"). A printable ASCII id
// goes as it is, '%' and inner spaces too; the body keeps the id as it
// came.
func TestIDsThatAreNotPlainASCIIAreSentVerifiably(t *testing.T) {
	t.Parallel()
	node := nodeVerifier(t)
	signed := newRecorder(t, status(http.StatusNoContent))
	q := newStoreQueue(t)
	want := map[string]string{ // event id: its header form
		"evt_plain":    "evt_plain",
		"evt_ünï😀":     "evt_%C3%BCn%C3%AF%F0%9F%98%80",
		"evt_trail ":   "evt_trail%20",
		" evt_lead":    "%20evt_lead",
		"evt_100%_off": "evt_100%_off", // printable ASCII goes as it is
		"evt a b":      "evt a b",
		"evt_ü 100%":   "evt_%C3%BC%20100%25",
	}
	var ids []int64
	for id := range want {
		ids = append(ids, q.emit(t, "signed", id, "note.créée", `{"id":"n_1"}`))
	}
	start(t, q, []Target{{Name: "signed", URL: signed.srv.URL, Secret: testSecret, AllowPrivate: true}}, Options{})
	for _, id := range ids {
		q.waitFor(t, 10*time.Second, "delivery", q.rowStatus(t, id, StatusDelivered))
	}
	hits := signed.all()
	if len(hits) != len(want) {
		t.Fatalf("got %d requests, want %d", len(hits), len(want))
	}
	for _, h := range hits {
		var env struct {
			EventID string `json:"event_id"`
		}
		if err := json.Unmarshal(h.body, &env); err != nil {
			t.Fatal(err)
		}
		if got := h.header.Get(HeaderEventID); got != want[env.EventID] {
			t.Errorf("event %q: X-Event-Id %q, want %q", env.EventID, got, want[env.EventID])
		}
		if got := h.header.Get(intake.HeaderWebhookID); got != want[env.EventID] {
			t.Errorf("event %q: webhook-id %q, want %q", env.EventID, got, want[env.EventID])
		}
		if got := h.header.Get(HeaderEventType); got != "note.cr%C3%A9%C3%A9e" {
			t.Errorf("event %q: X-Event-Type %q, want note.cr%%C3%%A9%%C3%%A9e", env.EventID, got)
		}
		if err := verifyWithNode(t, node, testSecret, h.header, h.body); err != nil {
			t.Errorf("event %q: standardwebhooks rejects the signature: %v", env.EventID, err)
		}
	}
}
