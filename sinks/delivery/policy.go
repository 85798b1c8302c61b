package delivery

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/backstop-sync/backstop"
)

// DefaultRetrySchedule is the delay before each retry: after the first,
// second, third and fourth failed attempt. The fifth failure dead-letters.
// 429 answers are not failures: they pause the target and leave the
// schedule where it was.
var DefaultRetrySchedule = []time.Duration{time.Minute, 10 * time.Minute, time.Hour, 24 * time.Hour}

const (
	// jitter is the spread of a retry delay: ±10%.
	jitter = 0.1
	// minPause and maxPause bound a 429's pause. The floor keeps a target
	// that answers "Retry-After: 0" from being hammered; the ceiling bounds
	// a far-future date.
	minPause = time.Second
	maxPause = 24 * time.Hour
)

// Decision is what the retry policy makes of one attempt.
type Decision struct {
	// Status is StatusDelivered, StatusRetrying or StatusDeadLetter.
	Status string
	// NextAttemptAt is when a retrying row is due again; zero otherwise.
	NextAttemptAt time.Time
	// Pause, when positive, is how long the whole target must wait (429).
	Pause time.Duration
	// Disable says the target must be disabled (410 Gone).
	Disable bool
	// Reason says in a few words why, for logs and the disable reason.
	Reason string
	// Failures is the row's count of failed attempts after this one: one
	// more than before for a failure (5xx, 3xx, timeout, connection error,
	// a 4xx that dead-letters), the same for a 2xx or a 429.
	Failures int
}

// Next is the retry policy. attempt is the number of the attempt just made
// (1-based, every attempt counted); failures how many of the row's earlier
// attempts failed (Row.Failures); status the attempt's HTTP status (0 when
// err says no answer came); answer the answer's headers (nil without one),
// of which Next reads Retry-After;
// rnd a number in [0, 1) that places the jitter.
//
//   - 2xx: delivered.
//   - 429: retrying, and the target pauses for Retry-After (either form,
//     read by backstop.RetryAfterIn, a date against the target's clock, kept
//     within 1 s..24 h), or for the
//     schedule's first step when there is none. NextAttemptAt is when the
//     pause ends. A 429 is the target's flow control, not a failure: it
//     does not count in Failures, so it never moves the row along its
//     schedule nor towards its dead letter.
//   - 410: dead-letter, and the target is disabled.
//   - other 4xx: dead-letter at once.
//   - 5xx, 3xx (redirects are not followed), any other status, a timeout or
//     a connection error (err != nil): a failure, the row's n-th
//     (n = failures+1): retrying after schedule[n-1] ±10%, or dead-letter
//     when n > len(schedule), so the default schedule dead-letters on the
//     5th failed attempt, however many 429s came between them.
func Next(schedule []time.Duration, attempt, failures int, status int, answer http.Header, err error, now time.Time, rnd float64) Decision {
	failures = max(failures, 0)
	if err == nil {
		switch {
		case status >= 200 && status <= 299:
			return Decision{Status: StatusDelivered, Reason: httpReason(status), Failures: failures}
		case status == http.StatusTooManyRequests:
			pause, ok := backstop.RetryAfterIn(answer, now)
			if !ok {
				pause = minPause
				if len(schedule) > 0 {
					pause = schedule[0]
				}
			} else {
				pause = min(max(pause, minPause), maxPause)
			}
			return Decision{Status: StatusRetrying, NextAttemptAt: now.Add(pause), Pause: pause,
				Reason: pauseReason(pause), Failures: failures}
		case status == http.StatusGone:
			return Decision{Status: StatusDeadLetter, Disable: true, Reason: "HTTP 410 Gone", Failures: failures + 1}
		case status >= 400 && status <= 499:
			return Decision{Status: StatusDeadLetter, Reason: httpReason(status), Failures: failures + 1}
		}
	}
	reason := httpReason(status)
	if err != nil {
		reason = "no answer"
	}
	failures++
	if failures > len(schedule) {
		return Decision{Status: StatusDeadLetter, Failures: failures,
			Reason: fmt.Sprintf("%s on attempt %d, failure %d, the last", reason, max(attempt, 1), failures)}
	}
	return Decision{Status: StatusRetrying, NextAttemptAt: now.Add(jittered(schedule[failures-1], rnd)), Reason: reason, Failures: failures}
}

// pauseReason is the Reason of a 429 that pauses the target for pause.
func pauseReason(pause time.Duration) string {
	return fmt.Sprintf("HTTP 429, paused for %v", pause.Round(time.Millisecond))
}

// httpReason is the Reason of an answer with status: "HTTP 200". Every
// attempt has one, so it is made without fmt.
func httpReason(status int) string {
	if status == http.StatusOK {
		return "HTTP 200"
	}
	return "HTTP " + strconv.Itoa(status)
}

// jittered spreads d by ±10% as rnd goes from 0 to 1.
func jittered(d time.Duration, rnd float64) time.Duration {
	rnd = min(max(rnd, 0), 1)
	return time.Duration(float64(d) * (1 - jitter + 2*jitter*rnd))
}
