package backstop

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ParseRetryAfter reads a Retry-After header value (RFC 9110 §10.2.3) at now:
// delta seconds, or an HTTP-date in any of the three forms http.ParseTime
// accepts (IMF-fixdate, RFC 850, asctime). A date in the past gives 0, true.
// An empty, negative or unreadable value gives 0, false. A delta too large
// for a time.Duration gives the largest Duration; callers cap it.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if isDigits(v) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n > int64(math.MaxInt64/time.Second) {
			return time.Duration(math.MaxInt64), true
		}
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	if d := t.Sub(now); d > 0 {
		return d, true
	}
	return 0, true
}

// RetryAfterIn reads the Retry-After header of an answer with headers h that
// arrived at now (local clock), as ParseRetryAfter does, but with an
// HTTP-date read against the server's clock (ServerClock): the date is the
// server's, so against a local clock minutes ahead it would end the wait at
// once, and against one minutes behind stretch it by minutes.
func RetryAfterIn(h http.Header, now time.Time) (time.Duration, bool) {
	return ParseRetryAfter(h.Get("Retry-After"), ServerClock(h, now))
}

// How far the local clock may be behind or ahead of an answer's Date header
// before ServerClock goes by the Date header: Date has one-second
// resolution and is stamped before the answer travels, so clocks that
// agree show the local one up to about a second ahead, more on a slow
// answer.
const (
	clockBehindTolerance = time.Second
	clockAheadTolerance  = 2 * time.Second
)

// ServerClock returns the time on the clock of the server that answered
// with headers h, at local time now. Date is the server's clock when it
// answered, cut to the second, so the server's clock was then between Date
// and Date+1s, and is later by the answer's travel when it arrives.
//
// While Date agrees with now (now within a second behind it or two ahead,
// as close as a one-second Date can tell), ServerClock is now, but not
// past Date+1s: times the server sends are read as precisely as the local
// clock allows, and a local clock up to two seconds ahead reads them less
// than a second early. Otherwise the clocks are apart, by more than an
// answer's travel, and it is Date itself: timestamps in the server's own
// clock, such as an X-RateLimit-Reset in Unix seconds or a Retry-After
// date, then measure from it, and waits so measured are never short (long
// by the answer's travel and up to a second). Without a readable Date it
// is now.
func ServerClock(h http.Header, now time.Time) time.Time {
	v := h.Get("Date")
	if v == "" {
		return now
	}
	date, err := http.ParseTime(v)
	if err != nil {
		return now
	}
	if skew := now.Sub(date); skew < -clockBehindTolerance || skew > clockAheadTolerance {
		return date
	}
	if latest := date.Add(time.Second); now.After(latest) {
		return latest
	}
	return now
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
