package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/backstop-sync/backstop/sinks/intake"
)

// intake.proxy_tokens rotates the proxy's token without downtime: serve
// takes the old and the new one, and no other.
func TestServeProxyTakesEveryTokenOfARotation(t *testing.T) {
	s := startServeIntake(t, "  proxy_token: new-proxy-token-0123\n  proxy_tokens: [old-proxy-token-0123]\n")
	for _, tc := range []struct {
		token string
		want  int
	}{{"new-proxy-token-0123", 202}, {"old-proxy-token-0123", 202}, {"other-proxy-token-01", 401}} {
		if code, _, body := proxyTokenPost(t, s.addr, tc.token, "evt_"+tc.token); code != tc.want {
			t.Errorf("token %s: %d %s, want %d", tc.token, code, body, tc.want)
		}
	}
}

// Behind a load balancer (intake.trusted_proxies), the proxy's wrong-token
// limit counts each client X-Forwarded-For names, not the balancer's one
// address: a guesser blocks itself, not every caller.
func TestServeProxyLimitsTheClientBehindATrustedProxy(t *testing.T) {
	s := startServeIntake(t, "  proxy_token: "+proxyToken+"\n  trusted_proxies: [127.0.0.1/32, \"::1\"]\n")
	post := func(client, token, id string) int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+s.addr+"/outbox/billing", strings.NewReader(`{"n":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("X-Event-Id", id)
		// The client may write anything to the left; the balancer appends
		// the address it got the request from.
		req.Header.Set("X-Forwarded-For", "198.51.100.1, "+client)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	for i := range intake.MaxAuthFailures {
		if code := post("203.0.113.5", fmt.Sprint("guess-", i), fmt.Sprint("evt_guess_", i)); code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i+1, code)
		}
	}
	if code := post("203.0.113.5", proxyToken, "evt_guesser"); code != http.StatusTooManyRequests {
		t.Errorf("the guesser after %d wrong tokens: %d, want 429", intake.MaxAuthFailures, code)
	}
	if code := post("203.0.113.6", proxyToken, "evt_other"); code != http.StatusAccepted {
		t.Errorf("another client behind the same balancer: %d, want 202", code)
	}
}

// realClient believes X-Forwarded-For only from a trusted proxy, and only
// its last untrusted entry.
func TestRealClientBelievesOnlyTrustedProxies(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	var got string
	h := realClient(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { got = r.RemoteAddr }), trusted)
	for _, tc := range []struct{ remote, xff, want string }{
		{"10.1.2.3:5000", "203.0.113.5", "203.0.113.5:0"},
		{"10.1.2.3:5000", "1.2.3.4, 203.0.113.5, 10.9.9.9", "203.0.113.5:0"},
		{"10.1.2.3:5000", "", "10.1.2.3:5000"},
		{"10.1.2.3:5000", "garbage, 203.0.113.5", "203.0.113.5:0"},
		{"10.1.2.3:5000", "203.0.113.5, garbage", "10.1.2.3:5000"},
		{"192.0.2.9:5000", "203.0.113.5", "192.0.2.9:5000"},
		{"10.1.2.3:5000", "2001:db8::1", "[2001:db8::1]:0"},
		// Some balancers (Azure Application Gateway) write ip:port.
		{"10.1.2.3:5000", "203.0.113.5:61234", "203.0.113.5:0"},
		{"10.1.2.3:5000", "203.0.113.5:61234, 10.9.9.9:443", "203.0.113.5:0"},
		{"10.1.2.3:5000", "[2001:db8::1]:61234", "[2001:db8::1]:0"},
		{"10.1.2.3:5000", "[2001:db8::1]", "[2001:db8::1]:0"},
		{"10.1.2.3:5000", "203.0.113.5:port", "10.1.2.3:5000"},
		{"10.1.2.3:5000", "[203.0.113.5]:443", "203.0.113.5:0"},
		{"10.1.2.3:5000", "203.0.113.5:1:2", "10.1.2.3:5000"},
		{"10.1.2.3:5000", "host.example:443", "10.1.2.3:5000"},
	} {
		r := httptest.NewRequest(http.MethodPost, "/outbox/x", nil)
		r.RemoteAddr = tc.remote
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		h.ServeHTTP(httptest.NewRecorder(), r)
		if got != tc.want {
			t.Errorf("from %s with X-Forwarded-For %q: RemoteAddr %q, want %q", tc.remote, tc.xff, got, tc.want)
		}
	}
}
