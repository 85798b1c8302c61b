package intake

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"
)

// Wrong tokens count per host: every address of one IPv6 /64 is one
// client (a host may take a fresh address of its /64 for every guess), an
// IPv4-mapped address is its IPv4 address, and IPv4 addresses count one by
// one.
func TestClientAddrCountsAnIPv6Slash64AsOneClient(t *testing.T) {
	for remote, want := range map[string]string{
		"192.0.2.7:1234":              "192.0.2.7",
		"[::ffff:192.0.2.7]:1234":     "192.0.2.7",
		"[2001:db8:1:2::1]:443":       "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff:1:2:3]:1": "2001:db8:1:2::/64",
		"[2001:db8:1:3::1]:443":       "2001:db8:1:3::/64",
		"[fe80::1%eth0]:80":           "fe80::/64",
		"not an address":              "not an address",
	} {
		r := httptest.NewRequest("POST", "/outbox/billing", nil)
		r.RemoteAddr = remote
		if got := ClientAddr(r); got != want {
			t.Errorf("ClientAddr(%q) = %q, want %q", remote, got, want)
		}
	}
}

func TestAuthFailuresBlockAfterTheLimitForTheWindow(t *testing.T) {
	var f AuthFailures
	now := time.Unix(1_700_000_000, 0)
	for range MaxAuthFailures - 1 {
		f.Fail("a", now)
	}
	if w := f.Blocked("a", now); w != 0 {
		t.Fatalf("blocked %v after %d failures, want not yet", w, MaxAuthFailures-1)
	}
	f.Fail("a", now)
	if w := f.Blocked("a", now.Add(10*time.Second)); w != AuthFailureWindow-10*time.Second {
		t.Errorf("blocked %v, want %v", w, AuthFailureWindow-10*time.Second)
	}
	if w := f.Blocked("b", now); w != 0 {
		t.Errorf("another address blocked %v", w)
	}
	if w := f.Blocked("a", now.Add(AuthFailureWindow)); w != 0 {
		t.Errorf("blocked %v once the window ended", w)
	}
}

func TestAuthFailuresForgetOldAddresses(t *testing.T) {
	var f AuthFailures
	now := time.Unix(1_700_000_000, 0)
	for i := range MaxAuthTracked + 10 {
		f.Fail(fmt.Sprint("10.0.", i/256, ".", i%256), now.Add(time.Duration(i)*time.Millisecond))
	}
	if n := f.Tracked(); n > MaxAuthTracked {
		t.Errorf("%d addresses tracked, want at most %d", n, MaxAuthTracked)
	}
}

// A blocked address stays blocked while wrong tokens from many other
// addresses fill the table: they cannot be used to lift a block.
func TestAuthFailuresKeepABlockWhenTheTableFills(t *testing.T) {
	var f AuthFailures
	now := time.Unix(1_700_000_000, 0)
	for range MaxAuthFailures {
		f.Fail("blocked", now)
	}
	for i := range 2 * MaxAuthTracked {
		f.Fail(fmt.Sprint("2001:db8:", i, "::/64"), now.Add(time.Duration(i+1)*time.Millisecond))
	}
	if n := f.Tracked(); n > MaxAuthTracked {
		t.Errorf("%d addresses tracked, want at most %d", n, MaxAuthTracked)
	}
	if w := f.Blocked("blocked", now.Add(time.Second)); w == 0 {
		t.Error("the block was lifted by failures from other addresses")
	}
}
