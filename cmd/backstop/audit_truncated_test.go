package main

import (
	"strings"
	"testing"
	"time"
)

// TestSimAndDemoRefuseRatesThatAreNotNumbers: "backstop sim --drop-rate
// NaN" (or --error-rate, --mutation-rate NaN, --mutation-rate Inf) used to
// start and serve, losing no webhook, injecting no error, making no change;
// "backstop demo --rate NaN" ran, made no change, and said "mirror matches
// platform: yes". Each is refused (exit 2) naming its flag.
func TestSimAndDemoRefuseRatesThatAreNotNumbers(t *testing.T) {
	for _, args := range [][]string{
		{"sim", "--drop-rate", "NaN"}, {"sim", "--error-rate", "nan"},
		{"sim", "--mutation-rate", "NaN"}, {"sim", "--mutation-rate", "Inf"},
		{"demo", "--rate", "NaN"}, {"demo", "--rate", "+Inf"},
	} {
		run := append([]string(nil), args...)
		if args[0] == "sim" {
			run = append(run, "--listen", "127.0.0.1:0")
		} else {
			run = append(run, "--duration", "1s", "--objects", "10")
		}
		// The old binary served these (or ran the demo): 20 s is ample to refuse them.
		code, stdout, stderr := runBinaryFor(t, 20*time.Second, t.TempDir(), nil, run...)
		if code != exitUsage || !strings.Contains(stderr, args[1]+" ") {
			t.Errorf("%v: exit %d, want 2 with a message naming %s\n%s%s", args, code, args[1], stdout, stderr)
		}
	}
}
