package delivery

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestNext(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	sched := []time.Duration{time.Minute, 10 * time.Minute, time.Hour, 24 * time.Hour}
	connErr := errors.New("dial tcp: connection refused")
	tests := []struct {
		name       string
		attempt    int
		failures   int // before the attempt
		status     int
		retryAfter string
		err        error
		rnd        float64
		want       Decision
	}{
		{"200 delivered", 1, 0, 200, "", nil, 0.5, Decision{Status: StatusDelivered}},
		{"204 delivered on the last attempt", 5, 4, 204, "", nil, 0.5, Decision{Status: StatusDelivered, Failures: 4}},
		{"503 first attempt, no jitter", 1, 0, 503, "", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Minute), Failures: 1}},
		{"500 second attempt, jitter -10%", 2, 1, 500, "", nil, 0, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(9 * time.Minute), Failures: 2}},
		{"502 fourth attempt, jitter +10%", 4, 3, 502, "", nil, 1, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(24 * time.Hour * 11 / 10), Failures: 4}},
		{"500 fifth attempt dead-letters", 5, 4, 500, "", nil, 0.5, Decision{Status: StatusDeadLetter, Failures: 5}},
		{"connection error retries", 1, 0, 0, "", connErr, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Minute), Failures: 1}},
		{"connection error on 5th dead-letters", 5, 4, 0, "", connErr, 0.5, Decision{Status: StatusDeadLetter, Failures: 5}},
		{"302 is not followed, retries", 3, 2, 302, "", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Hour), Failures: 3}},
		{"301 on 5th dead-letters", 5, 4, 301, "", nil, 0.5, Decision{Status: StatusDeadLetter, Failures: 5}},
		{"400 dead-letters at once", 1, 0, 400, "", nil, 0.5, Decision{Status: StatusDeadLetter, Failures: 1}},
		{"401 dead-letters at once", 1, 0, 401, "", nil, 0.5, Decision{Status: StatusDeadLetter, Failures: 1}},
		{"404 dead-letters at once", 1, 0, 404, "", nil, 0.5, Decision{Status: StatusDeadLetter, Failures: 1}},
		{"413 dead-letters at once", 2, 1, 413, "", nil, 0.5, Decision{Status: StatusDeadLetter, Failures: 2}},
		{"410 dead-letters and disables", 1, 0, 410, "", nil, 0.5, Decision{Status: StatusDeadLetter, Disable: true, Failures: 1}},
		{"429 delta seconds", 1, 0, 429, "120", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(2 * time.Minute), Pause: 2 * time.Minute}},
		{"429 HTTP-date", 1, 0, 429, "Fri, 02 Jan 2026 03:05:05 GMT", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Minute), Pause: time.Minute}},
		{"429 without Retry-After: first step", 1, 0, 429, "", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Minute), Pause: time.Minute}},
		{"429 unreadable Retry-After: first step", 1, 0, 429, "soon", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Minute), Pause: time.Minute}},
		{"429 Retry-After 0: one second floor", 1, 0, 429, "0", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Second), Pause: time.Second}},
		{"429 date in the past: floor", 1, 0, 429, "Thu, 01 Jan 2026 00:00:00 GMT", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Second), Pause: time.Second}},
		{"429 huge: 24h cap", 1, 0, 429, "99999999999999999999", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(24 * time.Hour), Pause: 24 * time.Hour}},
		{"429 past the schedule never dead-letters", 9, 0, 429, "1", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Second), Pause: time.Second}},
		{"429 after failures leaves them as they were", 4, 3, 429, "1", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Second), Pause: time.Second, Failures: 3}},
		// Issue 5's repro: five 429s, then 503 on attempt 6 is the
		// first failure, not the last.
		{"503 after five 429s is the first failure", 6, 0, 503, "", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Minute), Failures: 1}},
		{"500 on attempt 9, the 5th failure, dead-letters", 9, 4, 500, "", nil, 0.5, Decision{Status: StatusDeadLetter, Failures: 5}},
		{"error wins over a status", 1, 0, 200, "", connErr, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Minute), Failures: 1}},
		// The target's clock is 10 minutes behind ours (its Date header):
		// its Retry-After date, a minute from its now, is a minute's wait,
		// not a date 9 minutes past; and 10 minutes ahead, not 11.
		{"429 HTTP-date, target's clock behind", 1, 0, 429, "Fri, 02 Jan 2026 02:55:05 GMT|Fri, 02 Jan 2026 02:54:05 GMT", nil, 0.5,
			Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Minute), Pause: time.Minute}},
		{"429 HTTP-date, target's clock ahead", 1, 0, 429, "Fri, 02 Jan 2026 03:15:05 GMT|Fri, 02 Jan 2026 03:14:05 GMT", nil, 0.5,
			Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Minute), Pause: time.Minute}},
		// A Date a second off is clocks that agree: ours is used.
		{"429 HTTP-date, Date within the tolerance", 1, 0, 429, "Fri, 02 Jan 2026 03:05:05 GMT|Fri, 02 Jan 2026 03:04:04 GMT", nil, 0.5,
			Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Minute), Pause: time.Minute}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// retryAfter is the Retry-After header, then after a "|" the
			// answer's Date header when it has one.
			h := http.Header{}
			retryAfter, date, _ := strings.Cut(tt.retryAfter, "|")
			if retryAfter != "" {
				h.Set("Retry-After", retryAfter)
			}
			if date != "" {
				h.Set("Date", date)
			}
			got := Next(sched, tt.attempt, tt.failures, tt.status, h, tt.err, now, tt.rnd)
			got.Reason = ""
			if got != tt.want {
				t.Errorf("Next(attempt %d, %d failures, %d, %q, %v) = %+v, want %+v", tt.attempt, tt.failures, tt.status, tt.retryAfter, tt.err, got, tt.want)
			}
		})
	}
}

func TestNextEmptySchedule(t *testing.T) {
	now := time.Now()
	if got := Next(nil, 1, 0, http.StatusServiceUnavailable, nil, nil, now, 0.5); got.Status != StatusDeadLetter {
		t.Errorf("empty schedule, 503 on attempt 1: %+v, want dead_letter", got)
	}
	if got := Next(nil, 1, 0, http.StatusTooManyRequests, nil, nil, now, 0.5); got.Pause != time.Second {
		t.Errorf("empty schedule, 429 without Retry-After: pause %v, want 1s", got.Pause)
	}
}

func TestJitterStaysWithinTenPercent(t *testing.T) {
	for _, rnd := range []float64{-1, 0, 0.25, 0.5, 0.999, 1, 2} {
		d := jittered(time.Hour, rnd)
		if d < 54*time.Minute || d > 66*time.Minute {
			t.Errorf("jittered(1h, %v) = %v, outside ±10%%", rnd, d)
		}
	}
}
