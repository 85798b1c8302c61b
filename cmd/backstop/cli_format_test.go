package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// A target's answer is shown by `deliveries show` and `deliveries list`:
// its bytes must not reach the terminal as escape sequences.
func TestOneLineShowsControlCharactersEscaped(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"ok", 10, "ok"},
		{"line one\r\nline\ttwo", 40, "line one  line two"},
		{"\x1b[2J\x1b]0;owned\x07red", 40, `\x1b[2J\x1b]0;owned\ared`},
		{"bad \xff byte", 40, "bad \ufffd byte"},
		{"héllo wörld", 5, "héllo…"},
		{"\x00\x00", 1, `\x00…`},
		{"ok \u202egnp.exe", 40, `ok \u202egnp.exe`},
	} {
		if got := oneLine(tc.in, tc.n); got != tc.want {
			t.Errorf("oneLine(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

// --since and --before take a date too (its start, UTC), as people write
// one: "purge --dead --before 2026-01-01".
func TestParseSinceTakesADate(t *testing.T) {
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2026-01-01":           time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		"2026-01-01T10:00:00Z": time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC),
		"3d":                   now.AddDate(0, 0, -3),
		"2h":                   now.Add(-2 * time.Hour),
		"1d12h":                now.Add(-36 * time.Hour), // as in the configuration
	} {
		if got, err := parseSince(in, now); err != nil || !got.Equal(want) {
			t.Errorf("parseSince(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	// Before 1970, which the platform refused with a 400 (exit 1).
	for _, in := range []string{"1000000d", "9223372036854775807d", "1969-12-31", "0001-01-01T00:00:00Z"} {
		if _, err := parseSince(in, now); err == nil || !strings.Contains(err.Error(), "before 1970-01-01") {
			t.Errorf("parseSince(%q): %v, want refused as before 1970", in, err)
		}
	}
	for _, in := range []string{"2026-13-01", "yesterday", "-3d", "0h"} {
		if _, err := parseSince(in, now); err == nil || !strings.Contains(err.Error(), "a date (2026-01-31)") {
			t.Errorf("parseSince(%q): %v, want refused naming the forms", in, err)
		}
	}
}

// JSON logs give durations as people read them ("1.5s"), as the text
// format does, not as integer nanoseconds.
func TestJSONLogsWriteDurationsAsText(t *testing.T) {
	var out strings.Builder
	log, err := (&globals{logLevel: "info", logFormat: "json"}).newLogger(&out)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("target paused", "for", 1500*time.Millisecond, "group", slog.GroupValue(slog.Duration("wait", 2*time.Second)))
	if got := out.String(); !strings.Contains(got, `"for":"1.5s"`) || !strings.Contains(got, `"wait":"2s"`) {
		t.Errorf("JSON log line %s, want durations as text", got)
	}
}

// The readiness write probe runs at most once a second, however often
// /readyz is asked, and then again.
func TestCachedProbeRunsAtMostOnceASecond(t *testing.T) {
	c := &cachedProbe{every: time.Hour}
	runs := 0
	probe := func(context.Context) error { runs++; return fmt.Errorf("disk full %d", runs) }
	for range 5 {
		if err := c.check(context.Background(), probe); err == nil || err.Error() != "disk full 1" {
			t.Fatalf("check = %v, want the first run's error", err)
		}
	}
	c.every = 0
	if err := c.check(context.Background(), probe); err == nil || err.Error() != "disk full 2" || runs != 2 {
		t.Errorf("check after its interval = %v (%d runs), want a second run", err, runs)
	}
}

// The environment's durations read as the configuration's do: a day count
// first ("1d", "1d12h") as well as Go's forms.
func TestEnvDurationsTakeDays(t *testing.T) {
	lookup := func(v string) func(string) (string, bool) {
		return func(k string) (string, bool) {
			if k == "BACKSTOP_PROGRESS_INTERVAL" || k == "BACKSTOP_DRAIN_PERIOD" {
				return v, true
			}
			return "", false
		}
	}
	for v, want := range map[string]time.Duration{"1d": 24 * time.Hour, "1d12h": 36 * time.Hour, "90s": 90 * time.Second} {
		m := &Main{LookupEnv: lookup(v)}
		if got, err := progressInterval(m); err != nil || got != want {
			t.Errorf("BACKSTOP_PROGRESS_INTERVAL=%s: %v, %v; want %v", v, got, err, want)
		}
		if got, err := m.drainPeriod(); err != nil || got != want {
			t.Errorf("BACKSTOP_DRAIN_PERIOD=%s: %v, %v; want %v", v, got, err, want)
		}
	}
	for _, v := range []string{"1x", "-1d", "d"} {
		m := &Main{LookupEnv: lookup(v)}
		if _, err := progressInterval(m); err == nil {
			t.Errorf("BACKSTOP_PROGRESS_INTERVAL=%s accepted", v)
		}
		if _, err := m.drainPeriod(); err == nil {
			t.Errorf("BACKSTOP_DRAIN_PERIOD=%s accepted", v)
		}
	}
}
