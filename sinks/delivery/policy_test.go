package delivery

import (
	"errors"
	"net/http"
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
		status     int
		retryAfter string
		err        error
		rnd        float64
		want       Decision
	}{
		{"200 delivered", 1, 200, "", nil, 0.5, Decision{Status: StatusDelivered}},
		{"204 delivered on the last attempt", 5, 204, "", nil, 0.5, Decision{Status: StatusDelivered}},
		{"503 first attempt, no jitter", 1, 503, "", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Minute)}},
		{"500 second attempt, jitter -10%", 2, 500, "", nil, 0, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(9 * time.Minute)}},
		{"502 fourth attempt, jitter +10%", 4, 502, "", nil, 1, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(24 * time.Hour * 11 / 10)}},
		{"500 fifth attempt dead-letters", 5, 500, "", nil, 0.5, Decision{Status: StatusDeadLetter}},
		{"connection error retries", 1, 0, "", connErr, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Minute)}},
		{"connection error on 5th dead-letters", 5, 0, "", connErr, 0.5, Decision{Status: StatusDeadLetter}},
		{"302 is not followed, retries", 3, 302, "", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Hour)}},
		{"301 on 5th dead-letters", 5, 301, "", nil, 0.5, Decision{Status: StatusDeadLetter}},
		{"400 dead-letters at once", 1, 400, "", nil, 0.5, Decision{Status: StatusDeadLetter}},
		{"401 dead-letters at once", 1, 401, "", nil, 0.5, Decision{Status: StatusDeadLetter}},
		{"404 dead-letters at once", 1, 404, "", nil, 0.5, Decision{Status: StatusDeadLetter}},
		{"413 dead-letters at once", 2, 413, "", nil, 0.5, Decision{Status: StatusDeadLetter}},
		{"410 dead-letters and disables", 1, 410, "", nil, 0.5, Decision{Status: StatusDeadLetter, Disable: true}},
		{"429 delta seconds", 1, 429, "120", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(2 * time.Minute), Pause: 2 * time.Minute}},
		{"429 HTTP-date", 1, 429, "Fri, 02 Jan 2026 03:05:05 GMT", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Minute), Pause: time.Minute}},
		{"429 without Retry-After: first step", 1, 429, "", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Minute), Pause: time.Minute}},
		{"429 unreadable Retry-After: first step", 1, 429, "soon", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Minute), Pause: time.Minute}},
		{"429 Retry-After 0: one second floor", 1, 429, "0", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Second), Pause: time.Second}},
		{"429 date in the past: floor", 1, 429, "Thu, 01 Jan 2026 00:00:00 GMT", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Second), Pause: time.Second}},
		{"429 huge: 24h cap", 1, 429, "99999999999999999999", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(24 * time.Hour), Pause: 24 * time.Hour}},
		{"429 past the schedule never dead-letters", 9, 429, "1", nil, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Second), Pause: time.Second}},
		{"500 after 429s past the schedule dead-letters", 6, 500, "", nil, 0.5, Decision{Status: StatusDeadLetter}},
		{"error wins over a status", 1, 200, "", connErr, 0.5, Decision{Status: StatusRetrying, NextAttemptAt: now.Add(time.Minute)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Next(sched, tt.attempt, tt.status, tt.retryAfter, tt.err, now, tt.rnd)
			got.Reason = ""
			if got != tt.want {
				t.Errorf("Next(attempt %d, %d, %q, %v) = %+v, want %+v", tt.attempt, tt.status, tt.retryAfter, tt.err, got, tt.want)
			}
		})
	}
}

func TestNextEmptySchedule(t *testing.T) {
	now := time.Now()
	if got := Next(nil, 1, http.StatusServiceUnavailable, "", nil, now, 0.5); got.Status != StatusDeadLetter {
		t.Errorf("empty schedule, 503 on attempt 1: %+v, want dead_letter", got)
	}
	if got := Next(nil, 1, http.StatusTooManyRequests, "", nil, now, 0.5); got.Pause != time.Second {
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
