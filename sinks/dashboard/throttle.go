package dashboard

import (
	"net/http"
	"strconv"
	"time"

	"github.com/backstop-sync/backstop/sinks/intake"
)

// Failed sign-ins (a wrong token in the login form or in a bearer header)
// are limited per client address as the webhook proxy's are
// (intake.AuthFailures): after maxFailures within failureWindow, that
// address is answered 429 until the window ends, so the token cannot be
// guessed at network speed. A correct token does not reset the count: an
// attacker who also holds the token gains nothing from it. Every address
// of an IPv6 /64 counts as one client (intake.ClientAddr).
const (
	maxFailures   = intake.MaxAuthFailures
	failureWindow = intake.AuthFailureWindow
)

// clientAddr is the address failures are counted against (see
// intake.ClientAddr).
func clientAddr(r *http.Request) string { return intake.ClientAddr(r) }

// tooManyFailures answers 429 with Retry-After when r's address has failed
// to sign in too often, and reports whether it did.
func (d *Dashboard) tooManyFailures(w http.ResponseWriter, r *http.Request) bool {
	wait := d.failed.Blocked(clientAddr(r), d.now())
	if wait <= 0 {
		return false
	}
	secs := int((wait + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	d.fail(w, r, http.StatusTooManyRequests, "too_many_failures",
		"Too many wrong tokens from this address; try again in "+strconv.Itoa(secs)+" s.")
	return true
}
