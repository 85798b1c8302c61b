package main

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sources/sim"
)

// TestBadLogFlagsExit2Everywhere checks the README's exit codes ("2 bad
// usage or configuration") for --log-level and --log-format on the real
// binary: every command refuses a bad value with exit 2 and a line naming
// the flag, also those that log nothing, and does nothing else (cursors
// reset keeps the cursors).
func TestBadLogFlagsExit2Everywhere(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 30}})
	if code, _, stderr := e.run(context.Background(), "backfill", "payments"); code != 0 {
		t.Fatalf("backfill: exit %d\n%s", code, stderr)
	}
	commands := [][]string{
		{"cursors"}, {"cursors", "reset", "payments"}, {"jobs"},
		{"deliveries", "list"}, {"deliveries", "targets"}, {"version"}, {"sync", "payments"},
	}
	for _, bad := range [][]string{{"--log-level", "loud"}, {"--log-format", "xml"}} {
		for _, args := range commands {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			cmd := exec.CommandContext(ctx, binPath, append(append([]string{"--config", e.config}, bad...), args...)...)
			cmd.Env = e.environ(e.sim.APIKey())
			out, err := cmd.CombinedOutput()
			cancel()
			var exit *exec.ExitError
			code := 0
			if errors.As(err, &exit) {
				code = exit.ExitCode()
			} else if err != nil {
				t.Fatalf("%v %v: %v", bad, args, err)
			}
			if code != 2 || !strings.Contains(string(out), bad[0]+" ") {
				t.Errorf("backstop %s %s: exit %d, want 2 naming %s\n%s", strings.Join(bad, " "), strings.Join(args, " "), code, bad[0], out)
			}
		}
	}
	code, stdout, stderr := e.run(context.Background(), "cursors", "--json")
	if code != 0 || !strings.Contains(stdout, `"resource": "payments"`) {
		t.Errorf("cursors after the refused resets: exit %d, want payments' cursors kept\n%s%s", code, stdout, stderr)
	}
}
