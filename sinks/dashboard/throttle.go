package dashboard

import (
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Failed sign-ins (a wrong token in the login form or in a bearer header)
// are limited per client address: after maxFailures within failureWindow,
// that address is answered 429 until the window ends, so the token cannot
// be guessed at network speed. A correct token does not reset the count:
// an attacker who also holds the token gains nothing from it.
const (
	maxFailures   = 10
	failureWindow = time.Minute
	// maxTracked bounds the addresses remembered; when full, expired
	// entries are dropped, and if none has expired the oldest window goes.
	maxTracked = 4096
)

// failures counts failed sign-ins per client address. The zero value is
// ready to use.
type failures struct {
	mu    sync.Mutex
	addrs map[string]failureWindowState
}

type failureWindowState struct {
	start time.Time
	count int
}

// clientAddr is the address failures are counted against: the peer's IP
// (RemoteAddr; a proxy in front should be configured to limit on its own).
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// blocked reports how long addr must wait before trying again, or 0.
func (f *failures) blocked(addr string, now time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.addrs[addr]
	if !ok || now.Sub(st.start) >= failureWindow || st.count < maxFailures {
		return 0
	}
	return st.start.Add(failureWindow).Sub(now)
}

// fail records a failed sign-in from addr at now.
func (f *failures) fail(addr string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.addrs == nil {
		f.addrs = make(map[string]failureWindowState)
	}
	st, ok := f.addrs[addr]
	if !ok || now.Sub(st.start) >= failureWindow {
		if !ok && len(f.addrs) >= maxTracked {
			f.evict(now)
		}
		st = failureWindowState{start: now}
	}
	st.count++
	f.addrs[addr] = st
}

// evict drops expired windows, or the oldest one when none has expired.
func (f *failures) evict(now time.Time) {
	var oldest string
	var oldestStart time.Time
	for a, st := range f.addrs {
		if now.Sub(st.start) >= failureWindow {
			delete(f.addrs, a)
			continue
		}
		if oldest == "" || st.start.Before(oldestStart) {
			oldest, oldestStart = a, st.start
		}
	}
	if len(f.addrs) >= maxTracked && oldest != "" {
		delete(f.addrs, oldest)
	}
}

// tooManyFailures answers 429 with Retry-After when r's address has failed
// to sign in too often, and reports whether it did.
func (d *Dashboard) tooManyFailures(w http.ResponseWriter, r *http.Request) bool {
	wait := d.failed.blocked(clientAddr(r), d.now())
	if wait <= 0 {
		return false
	}
	secs := int((wait + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	d.fail(w, r, http.StatusTooManyRequests, "too_many_failures",
		"Too many wrong tokens from this address; try again in "+strconv.Itoa(secs)+" s.")
	return true
}
