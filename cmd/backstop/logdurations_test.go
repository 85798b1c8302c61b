package main

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Log lines showed durations to the nanosecond ("target paused
// for=8.597005569s"). Both log formats now round them to the millisecond,
// and a duration under a millisecond to the microsecond, so that it does
// not read as 0s.
func TestLogsRoundDurations(t *testing.T) {
	for _, tt := range []struct {
		format string
		want   []string
	}{
		{"text", []string{"for=8.597s", "wait=1.5s", "commit=537µs", "ns=500ns", "neg=-2.001s"}},
		{"json", []string{`"for":"8.597s"`, `"wait":"1.5s"`, `"commit":"537µs"`, `"ns":"500ns"`, `"neg":"-2.001s"`}},
	} {
		var out strings.Builder
		log, err := (&globals{logLevel: "info", logFormat: tt.format}).newLogger(&out)
		if err != nil {
			t.Fatal(err)
		}
		log.Info("target paused", "for", 8597005569*time.Nanosecond,
			"group", slog.GroupValue(slog.Duration("wait", 1500*time.Millisecond+400*time.Microsecond)),
			"commit", 537123*time.Nanosecond, "ns", 500*time.Nanosecond, "neg", -2000600*time.Microsecond)
		got := out.String()
		for _, w := range tt.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s log line %s: want %s", tt.format, got, w)
			}
		}
	}
}
