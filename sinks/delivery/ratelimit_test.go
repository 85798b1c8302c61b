package delivery

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/internal/syncbuf"
)

// A 429 pauses the target but does not use up the row's retries: only
// failed attempts count towards the schedule and the dead letter after the
// 5th, while X-Delivery-Attempt and the attempt log count every attempt.
// Here the 5th attempt is the 4th failure, which the old count (every
// attempt) dead-lettered as past a schedule of four steps.
func TestRateLimitedAttemptsAreNotFailures(t *testing.T) {
	t.Parallel()
	answers := []int{429, 503, 503, 503, 503, 200}
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		code := answers[min(n, len(answers))-1]
		if code == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "0") // the 1 s floor
		}
		w.WriteHeader(code)
	})
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "payment.succeeded", `{"id":"pay_1"}`)
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, RetrySchedule: ms(5, 5, 5, 5)}}, Options{})

	q.waitFor(t, 20*time.Second, "delivery or dead letter", func() bool {
		s := q.row(t, id).Status
		return s == StatusDelivered || s == StatusDeadLetter
	})
	r := q.row(t, id)
	if r.Status != StatusDelivered || r.Attempts != 6 || r.Failures != 4 || r.LastStatus != 200 {
		t.Fatalf("row = %+v, want delivered on attempt 6 after 4 failures (%s)", r, r.LastError)
	}
	as := q.attemptsOf(t, id)
	if got, want := fmt.Sprint(codes(as)), fmt.Sprint(answers); got != want {
		t.Errorf("attempt codes %s, want %s", got, want)
	}
	for i, h := range rec.all() {
		if got := h.header.Get(HeaderDeliveryAttempt); got != fmt.Sprint(i+1) {
			t.Errorf("request %d: %s %q, want every attempt numbered", i+1, HeaderDeliveryAttempt, got)
		}
		if i < len(as) && as[i].Attempt != i+1 {
			t.Errorf("attempt log %d numbered %d", i+1, as[i].Attempt)
		}
	}
}

// With concurrency 1 a target gets its rows in queue order, a 429
// included: the row it answered is the first sent once the pause ends,
// whether the rest of the claim is held through the pause or (a pause
// longer than the claim's lease allows) released and claimed again.
func TestRateLimitKeepsQueueOrder(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		retryAfter func(now time.Time) string
		lease      time.Duration // 0: the default, which holds the claim through the pause
	}{
		{"delta seconds, claim held", func(time.Time) string { return "1" }, 0},
		{"HTTP-date, claim held", func(now time.Time) string {
			return now.Add(2 * time.Second).UTC().Truncate(time.Second).Format(http.TimeFormat)
		}, 0},
		// Timeout 100ms + 10s to record: a row may be sent for 400ms
		// of the claim only, less than the pause.
		{"delta seconds, claim released", func(time.Time) string { return "1" }, 10*time.Second + 500*time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
				if n == 1 {
					w.Header().Set("Retry-After", tt.retryAfter(time.Now()))
					w.WriteHeader(http.StatusTooManyRequests)
					return
				}
				w.WriteHeader(http.StatusOK)
			})
			q := newStoreQueue(t)
			var ids []int64
			for i := range 5 {
				ids = append(ids, q.add(t, "crm", fmt.Sprintf("C_%d", i), "contact.created", `{"id":"ct_1"}`))
			}
			start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, Concurrency: 1,
				Timeout: 100 * time.Millisecond, RetrySchedule: ms(5, 5, 5, 5)}}, Options{Lease: tt.lease})
			q.waitFor(t, 20*time.Second, "every delivery", func() bool {
				for _, id := range ids {
					if q.row(t, id).Status != StatusDelivered {
						return false
					}
				}
				return true
			})
			var got []string
			for _, h := range rec.all() {
				got = append(got, h.header.Get(HeaderEventID))
			}
			if want := "[C_0 C_0 C_1 C_2 C_3 C_4]"; fmt.Sprint(got) != want {
				t.Errorf("target got %v, want %s (the 429, then queue order)", got, want)
			}
			if r := q.row(t, ids[0]); r.Attempts != 2 || r.Failures != 0 {
				t.Errorf("C_0 = %d attempts, %d failures; want 2 and 0", r.Attempts, r.Failures)
			}
		})
	}
}

// doublingPacer pauses its target after a 429 for a second, doubled for
// each 429 in a row, as the rate-limit governor does, and reports that
// pause (PauseReporter).
type doublingPacer struct {
	mu     sync.Mutex
	until  time.Time
	streak int
}

var _ PauseReporter = (*doublingPacer)(nil)

func (p *doublingPacer) Acquire(ctx context.Context) (PaceTicket, error) {
	p.mu.Lock()
	wait := time.Until(p.until)
	p.mu.Unlock()
	if wait > 0 && !sleep(ctx, wait) {
		return nil, ctx.Err()
	}
	return p, nil
}

func (p *doublingPacer) Done(status int, _ http.Header) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if status != http.StatusTooManyRequests {
		p.streak = 0
		return
	}
	p.until = time.Now().Add(time.Second << p.streak)
	p.streak++
}

func (p *doublingPacer) Abort() {}

func (p *doublingPacer) PausedUntil(context.Context) (time.Time, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.until, nil
}

// After repeated 429s the pacer's pauses double while each answer says
// Retry-After: 1. What is logged and stored (the target's pause, which
// deliveries list and show print) is when the target is really tried
// again, not the answer's second.
func TestRepeatedRateLimitsReportTheRealPause(t *testing.T) {
	t.Parallel()
	rec := newRecorder(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n <= 2 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	q := newStoreQueue(t)
	id := q.add(t, "crm", "evt_1", "contact.created", `{"id":"ct_1"}`)
	var logs syncbuf.Buffer
	pacer := &doublingPacer{}
	start(t, q, []Target{{Name: "crm", URL: rec.srv.URL, AllowPrivate: true, RetrySchedule: ms(5, 5, 5, 5)}},
		Options{Pacers: map[string]Pacer{"crm": pacer}, Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})

	var stored []time.Time // the target's pause as stored after each 429
	q.waitFor(t, 20*time.Second, "delivery", func() bool {
		if st := q.state(t, "crm"); !st.PausedUntil.IsZero() && (len(stored) == 0 || !stored[len(stored)-1].Equal(st.PausedUntil)) {
			stored = append(stored, st.PausedUntil)
		}
		return q.row(t, id).Status == StatusDelivered
	})
	hits := rec.all()
	if len(hits) != 3 {
		t.Fatalf("%d requests, want 3 (429, 429, 200)", len(hits))
	}
	type line struct {
		Msg    string    `json:"msg"`
		Reason string    `json:"reason"`
		Next   time.Time `json:"next_attempt_at"`
	}
	var retries []line
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var l line
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "will retry" {
			retries = append(retries, l)
		}
	}
	if len(retries) != 2 {
		t.Fatalf("%d will-retry lines, want 2:\n%s", len(retries), logs.String())
	}
	for i, want := range []time.Duration{time.Second, 2 * time.Second} {
		l := retries[i]
		// The time logged is the pause's end: the next request comes
		// then, not before and (on a loaded machine) within a second.
		if next := hits[i+1].at; next.Before(l.Next.Add(-10*time.Millisecond)) || next.After(l.Next.Add(time.Second)) {
			t.Errorf("429 #%d logged next_attempt_at %v (%s); the next request came at %v", i+1, l.Next, l.Reason, next)
		}
		if real := l.Next.Sub(hits[i].at); real < want-50*time.Millisecond {
			t.Errorf("429 #%d: logged a pause of %v after the request, want about %v", i+1, real, want)
		}
		if d, err := time.ParseDuration(strings.TrimPrefix(l.Reason, "HTTP 429, paused for ")); err != nil ||
			d < want-100*time.Millisecond || d > want+100*time.Millisecond {
			t.Errorf("429 #%d: reason %q, want a pause of about %v", i+1, l.Reason, want)
		}
	}
	if len(stored) == 0 || stored[len(stored)-1].Sub(retries[1].Next).Abs() > time.Millisecond {
		t.Errorf("target's stored pauses %v, want the last to be the logged %v", stored, retries[1].Next)
	}
}
