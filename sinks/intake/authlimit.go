package intake

import (
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Wrong tokens (the proxy's bearer token, the dashboard's token) are
// limited per client address: after MaxAuthFailures within
// AuthFailureWindow, that address is refused until the window ends, so a
// token cannot be guessed at network speed. A correct token does not reset
// the count, and is refused too while the address is blocked: otherwise the
// answer to a guess would still say whether it was right.
const (
	MaxAuthFailures   = 10
	AuthFailureWindow = time.Minute
	// MaxAuthTracked bounds the addresses remembered; when full, expired
	// entries are dropped, and if none has expired the oldest window of an
	// address not blocked goes (the oldest of all when every one is).
	MaxAuthTracked = 4096
)

// AuthFailures counts wrong tokens per client address (see ClientAddr).
// The zero value is ready to use; it is safe for concurrent use.
type AuthFailures struct {
	mu    sync.Mutex
	addrs map[string]authWindow
}

type authWindow struct {
	start time.Time
	count int
}

// ClientAddr is the address wrong tokens are counted against: the peer's
// IP (RemoteAddr; a proxy in front should be configured to limit on its
// own), with an IPv6 address cut to its /64, since a single host commonly
// holds a whole /64 and could otherwise take a fresh address per guess. An
// IPv4-mapped IPv6 address counts as its IPv4 address.
func ClientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.WithZone("").Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// Blocked reports how long addr must wait before trying again, or 0.
func (f *AuthFailures) Blocked(addr string, now time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.addrs[addr]
	if !ok || now.Sub(st.start) >= AuthFailureWindow || st.count < MaxAuthFailures {
		return 0
	}
	return st.start.Add(AuthFailureWindow).Sub(now)
}

// Fail records a wrong token from addr at now.
func (f *AuthFailures) Fail(addr string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.addrs == nil {
		f.addrs = make(map[string]authWindow)
	}
	st, ok := f.addrs[addr]
	if !ok || now.Sub(st.start) >= AuthFailureWindow {
		if !ok && len(f.addrs) >= MaxAuthTracked {
			f.evict(now)
		}
		st = authWindow{start: now}
	}
	st.count++
	f.addrs[addr] = st
}

// Tracked returns how many addresses are remembered.
func (f *AuthFailures) Tracked() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.addrs)
}

// evict drops expired windows, or, when none has expired, the oldest
// window of an address not blocked (so that failures from many other
// addresses cannot lift a block), or the oldest of all when every one is.
func (f *AuthFailures) evict(now time.Time) {
	var oldest, oldestOpen string
	var oldestStart, oldestOpenStart time.Time
	for a, st := range f.addrs {
		if now.Sub(st.start) >= AuthFailureWindow {
			delete(f.addrs, a)
			continue
		}
		if oldest == "" || st.start.Before(oldestStart) {
			oldest, oldestStart = a, st.start
		}
		if st.count < MaxAuthFailures && (oldestOpen == "" || st.start.Before(oldestOpenStart)) {
			oldestOpen, oldestOpenStart = a, st.start
		}
	}
	if len(f.addrs) < MaxAuthTracked {
		return
	}
	if oldestOpen != "" {
		delete(f.addrs, oldestOpen)
	} else if oldest != "" {
		delete(f.addrs, oldest)
	}
}
