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

// TestSimRefusesWebhookFlagsThatWouldSendNothing: "backstop sim
// --mutation-rate 5 --drop-rate 0.1" (no --webhook-url) used to serve and
// send no webhook at all, its drop rate ignored, and "backstop sim
// --webhook-url URL" without --mutation-rate made no change, so sent no
// webhook either. Both are refused (exit 2) saying which flag is missing;
// the README's example, with both, still runs.
func TestSimRefusesWebhookFlagsThatWouldSendNothing(t *testing.T) {
	for _, c := range []struct {
		args       []string
		flag, want string // the flag refused, the flag missing
	}{
		{[]string{"--mutation-rate", "5", "--drop-rate", "0.1"}, "--drop-rate", "--webhook-url"},
		{[]string{"--mutation-rate", "5", "--retry-schedule", "1s"}, "--retry-schedule", "--webhook-url"},
		{[]string{"--webhook-url", "http://127.0.0.1:1/webhooks/botix", "--webhook-secret", "s"}, "--webhook-url", "--mutation-rate"},
	} {
		// The old binary served these: 20 s is ample to refuse them.
		code, stdout, stderr := runBinaryFor(t, 20*time.Second, t.TempDir(), nil, append([]string{"sim", "--listen", "127.0.0.1:0"}, c.args...)...)
		if code != exitUsage || !strings.Contains(stderr, c.flag) || !strings.Contains(stderr, c.want) {
			t.Errorf("sim %v: exit %d, want 2 naming %s and %s\n%s%s", c.args, code, c.flag, c.want, stdout, stderr)
		}
	}
	startSim(t, "--mutation-rate", "20", "--drop-rate", "0.1", "--duplicate-rate", "0.05",
		"--webhook-url", "http://127.0.0.1:1/webhooks/botix", "--webhook-secret", "s")
}
