package delivery

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The list from issue 5.
func TestCheckURLRefusesTheIssueList(t *testing.T) {
	tests := []struct{ url, want string }{
		{"http://127.0.0.1/", "refused: 127.0.0.1 is a loopback address (set allow_private on the target to allow)"},
		{"http://[::1]/", "refused: ::1 is a loopback address (set allow_private on the target to allow)"},
		{"http://[::ffff:127.0.0.1]/", "refused: ::ffff:127.0.0.1 is an IPv4-mapped IPv6 address of 127.0.0.1, a loopback address (set allow_private on the target to allow)"},
		{"http://169.254.169.254/latest/meta-data/", "refused: 169.254.169.254 is a cloud metadata address (set allow_private on the target to allow)"},
		{"http://10.0.0.1/", "refused: 10.0.0.1 is a private address (RFC 1918) (set allow_private on the target to allow)"},
		{"http://100.64.0.1/", "refused: 100.64.0.1 is a carrier-grade NAT address (100.64.0.0/10) (set allow_private on the target to allow)"},
		{"http://[fc00::1]/", "refused: fc00::1 is a unique local address (fc00::/7) (set allow_private on the target to allow)"},
		{"http://0.0.0.0/", "refused: 0.0.0.0 is an unspecified address (set allow_private on the target to allow)"},
		{"http://2130706433/", `refused: host "2130706433" is an IPv4 address (127.0.0.1) in a non-standard numeric form`},
		{"file:///etc/passwd", `refused: scheme "file" is not allowed (only http and https)`},
		// Beyond the issue's list.
		{"https://0x7f.1/", `refused: host "0x7f.1" is an IPv4 address (127.0.0.1) in a non-standard numeric form`},
		{"https://017700000001/", `refused: host "017700000001" is an IPv4 address (127.0.0.1) in a non-standard numeric form`},
		{"http://127.1/", `refused: host "127.1" is an IPv4 address (127.0.0.1) in a non-standard numeric form`},
		{"http://99999999999/", `refused: host "99999999999" is a number that is not a valid IPv4 address`},
		{"http://192.168.1.1:8080/x", "refused: 192.168.1.1 is a private address (RFC 1918) (set allow_private on the target to allow)"},
		{"http://172.16.5.4/", "refused: 172.16.5.4 is a private address (RFC 1918) (set allow_private on the target to allow)"},
		{"http://[fe80::1%25eth0]/", "refused: fe80::1 is a link-local address (set allow_private on the target to allow)"},
		{"http://[64:ff9b::a9fe:a9fe]/", "refused: 64:ff9b::a9fe:a9fe is a NAT64 address of 169.254.169.254, a cloud metadata address (set allow_private on the target to allow)"},
		{"http://[2002:7f00:1::]/", "refused: 2002:7f00:1:: is a 6to4 address of 127.0.0.1, a loopback address (set allow_private on the target to allow)"},
		{"http://224.0.0.1/", "refused: 224.0.0.1 is a multicast address (set allow_private on the target to allow)"},
		{"http://[ff02::1]/", "refused: ff02::1 is a multicast address (set allow_private on the target to allow)"},
		{"gopher://example.com/", `refused: scheme "gopher" is not allowed (only http and https)`},
		{"http:///path", "refused: the URL has no host"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			err := CheckURL(tt.url)
			if err == nil {
				t.Fatalf("CheckURL(%q) = nil, want %q", tt.url, tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("CheckURL(%q) = %q, want %q", tt.url, err, tt.want)
			}
			if !errors.Is(err, ErrRefused) {
				t.Errorf("CheckURL(%q) does not wrap ErrRefused", tt.url)
			}
		})
	}
}

func TestCheckURLAllows(t *testing.T) {
	for _, u := range []string{
		"https://example.com/hook",
		"http://93.184.216.34:8080/",
		"https://[2606:2800:220:1:248:1893:25c8:1946]/",
		"http://[::ffff:8.8.8.8]/",
		"http://[64:ff9b::808:808]/",
		"https://hooks.example.com/123abc", // a name: left to the dial-time guard
	} {
		if err := CheckURL(u); err != nil {
			t.Errorf("CheckURL(%q) = %v, want nil", u, err)
		}
	}
}

func TestCheckAddrRanges(t *testing.T) {
	refused := []string{"127.0.0.2", "10.255.255.255", "172.31.0.1", "192.168.0.1", "169.254.1.1",
		"100.127.255.255", "0.1.2.3", "255.255.255.255", "198.18.0.1", "::", "::1", "fd00:ec2::254",
		"fe80::abcd", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "64:ff9b::7f00:1", "64:ff9b:1::1", "::127.0.0.1"}
	for _, s := range refused {
		if err := CheckAddr(netip.MustParseAddr(s)); err == nil {
			t.Errorf("CheckAddr(%s) = nil, want refused", s)
		}
	}
	allowed := []string{"8.8.8.8", "1.1.1.1", "100.128.0.1", "172.32.0.1", "2001:4860:4860::8888", "::ffff:1.1.1.1"}
	for _, s := range allowed {
		if err := CheckAddr(netip.MustParseAddr(s)); err != nil {
			t.Errorf("CheckAddr(%s) = %v, want nil", s, err)
		}
	}
}

// The dial-time guard refuses whatever a URL resolves to, including names
// (localhost) and forms CheckURL would have caught first.
func TestNewClientRefusesAtDialTime(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())

	client := NewClient(Target{Name: "t", ConnectTimeout: time.Second, Timeout: 2 * time.Second})
	for _, host := range []string{"127.0.0.1", "localhost", "[::1]", "[::ffff:127.0.0.1]", "169.254.169.254", "10.0.0.1",
		"100.64.0.1", "[fc00::1]", "0.0.0.0"} {
		t.Run(host, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+host+":"+port+"/", nil)
			resp, err := client.Do(req)
			if err == nil {
				resp.Body.Close()
				t.Fatalf("POST to %s answered %d, want refused", host, resp.StatusCode)
			}
			if !errors.Is(err, ErrRefused) {
				t.Fatalf("POST to %s: %v, want a refusal", host, err)
			}
			if !strings.Contains(describe(err), "(set allow_private on the target to allow)") {
				t.Errorf("error %q does not say how to allow it", describe(err))
			}
		})
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the server was reached %d times", n)
	}

	allowed := NewClient(Target{Name: "t", AllowPrivate: true})
	resp, err := allowed.Post(srv.URL, "application/json", nil)
	if err != nil {
		t.Fatalf("AllowPrivate client: %v", err)
	}
	resp.Body.Close()
}

// An IPv4 address the guard refuses cannot hide in the IPv6 forms that
// carry one: SIIT's IPv4-translated ::ffff:0:a.b.c.d, and a Teredo
// address's server or (inverted) client address. The same forms around a
// public address pass.
func TestCheckAddrRefusesIPv4HiddenInTranslatedAndTeredo(t *testing.T) {
	tests := []struct{ addr, want string }{
		{"::ffff:0:7f00:1", "refused: ::ffff:0:7f00:1 is an IPv4-translated address of 127.0.0.1, a loopback address (set allow_private on the target to allow)"},
		{"::ffff:0:a9fe:a9fe", "refused: ::ffff:0:a9fe:a9fe is an IPv4-translated address of 169.254.169.254, a cloud metadata address (set allow_private on the target to allow)"},
		{"2001:0:a9fe:a9fe::f7f7:f7f7", "refused: 2001:0:a9fe:a9fe::f7f7:f7f7 is a Teredo address with server of 169.254.169.254, a cloud metadata address (set allow_private on the target to allow)"},
		{"2001:0:808:808::f5ff:fffe", "refused: 2001:0:808:808::f5ff:fffe is a Teredo address with client of 10.0.0.1, a private address (RFC 1918) (set allow_private on the target to allow)"},
	}
	for _, tt := range tests {
		err := CheckAddr(netip.MustParseAddr(tt.addr))
		if err == nil || err.Error() != tt.want {
			t.Errorf("CheckAddr(%s) = %v, want %q", tt.addr, err, tt.want)
		}
		if u := "http://[" + tt.addr + "]/"; CheckURL(u) == nil {
			t.Errorf("CheckURL(%q) = nil, want refused", u)
		}
	}
	for _, s := range []string{"::ffff:0:808:808", "2001:0:808:808::f7f7:f7f7"} {
		if err := CheckAddr(netip.MustParseAddr(s)); err != nil {
			t.Errorf("CheckAddr(%s) = %v, want nil", s, err)
		}
	}
}
