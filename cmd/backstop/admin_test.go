package main

import (
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// With admin.listen, /ui and /metrics are answered there and no longer
// where the platform's webhooks come in (404 with a hint); the probes are
// answered on both, webhooks on intake.listen only; SIGTERM stops both.
func TestAdminListenMovesUIAndMetricsOffTheWebhookAddress(t *testing.T) {
	admin := freeAddr(t)
	s := startServeEdited(t, func(cfg string) string {
		return cfg + "admin:\n  listen: " + admin + "\ndashboard:\n  token: a-dashboard-token-0123456789\n"
	})
	get := func(url string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer a-dashboard-token-0123456789")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for _, tc := range []struct {
		url, want string
		code      int
	}{
		{"http://" + admin + "/metrics", "backstop_intake_requests_total", 200},
		{"http://" + admin + "/ui", "<html", 200},
		{"http://" + admin + "/healthz", `"ok"`, 200},
		{"http://" + admin + "/readyz", `"ready"`, 200},
		{"http://" + admin + "/webhooks/botix", "admin address", 404},
		{"http://" + s.addr + "/metrics", "/ui and /metrics are on admin.listen", 404},
		{"http://" + s.addr + "/ui", "/ui and /metrics are on admin.listen", 404},
		{"http://" + s.addr + "/healthz", `"ok"`, 200},
		{"http://" + s.addr + "/readyz", `"ready"`, 200},
	} {
		if code, body := get(tc.url); code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("GET %s: %d %.200q, want %d with %q", tc.url, code, body, tc.code, tc.want)
		}
	}
	if code, _, body := proxyTokenPost(t, s.addr, "wrong-token-0123456789", "evt_x"); code != http.StatusNotFound && code != http.StatusUnauthorized {
		t.Errorf("the proxy on intake.listen: %d %s", code, body)
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve after SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop within 30 s of SIGTERM")
	}
	if _, err := http.Get("http://" + admin + "/healthz"); err == nil {
		t.Error("the admin address still answers after serve stopped")
	}
}
