package main

import "testing"

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
