package backstop

import (
	"math"
	"net/http"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	// Dates in the three forms of RFC 9110 §5.6.7, all naming the same instant.
	now := time.Date(1994, time.November, 6, 8, 49, 0, 0, time.UTC)
	tests := []struct {
		name   string
		in     string
		want   time.Duration
		wantOK bool
	}{
		{"delta", "120", 120 * time.Second, true},
		{"delta zero", "0", 0, true},
		{"delta surrounded by whitespace", "  7\t", 7 * time.Second, true},
		{"IMF-fixdate", "Sun, 06 Nov 1994 08:49:37 GMT", 37 * time.Second, true},
		{"RFC 850", "Sunday, 06-Nov-94 08:49:37 GMT", 37 * time.Second, true},
		{"asctime", "Sun Nov  6 08:49:37 1994", 37 * time.Second, true},
		{"date in the past", "Sun, 06 Nov 1994 08:48:00 GMT", 0, true},
		{"date now", "Sun, 06 Nov 1994 08:49:00 GMT", 0, true},
		{"huge delta", "99999999999999999999999", time.Duration(math.MaxInt64), true},
		{"delta beyond Duration", "9223372037", time.Duration(math.MaxInt64), true},
		{"negative", "-5", 0, false},
		{"plus sign", "+5", 0, false},
		{"fraction", "1.5", 0, false},
		{"garbage", "soon", 0, false},
		{"empty", "", 0, false},
		{"whitespace only", " \t ", 0, false},
		{"date without zone", "Sun, 06 Nov 1994 08:49:37", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ParseRetryAfter(tt.in, now)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestServerClock(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 400_000_000, time.UTC)
	for _, tt := range []struct {
		name, date string
		want       time.Time
	}{
		{"no Date", "", now},
		{"unreadable Date", "yesterday", now},
		{"Date of the same second", "Tue, 01 Dec 2026 12:00:00 GMT", now},
		// now is 1.4 s past this Date: the server's clock was before 12:00:00
		// when it answered, so now is taken as at most that.
		{"Date a second behind: not past Date+1s", "Tue, 01 Dec 2026 11:59:59 GMT", time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)},
		{"Date a second ahead", "Tue, 01 Dec 2026 12:00:01 GMT", now},
		{"server minutes behind", "Tue, 01 Dec 2026 11:55:00 GMT", time.Date(2026, 12, 1, 11, 55, 0, 0, time.UTC)},
		{"server minutes ahead", "Tue, 01 Dec 2026 12:05:00 GMT", time.Date(2026, 12, 1, 12, 5, 0, 0, time.UTC)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			if tt.date != "" {
				h.Set("Date", tt.date)
			}
			if got := ServerClock(h, now); !got.Equal(tt.want) {
				t.Errorf("ServerClock(Date %q) = %v, want %v", tt.date, got, tt.want)
			}
		})
	}
	// A Retry-After date is the server's: 30 s after its Date is a 30 s
	// wait, whichever way its clock is off.
	h := http.Header{"Date": {"Tue, 01 Dec 2026 11:55:00 GMT"}, "Retry-After": {"Tue, 01 Dec 2026 11:55:30 GMT"}}
	if d, ok := RetryAfterIn(h, now); !ok || d != 30*time.Second {
		t.Errorf("RetryAfterIn with the server 5 minutes behind = %v, %v; want 30s", d, ok)
	}
}
