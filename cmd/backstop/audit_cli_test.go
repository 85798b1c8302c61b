package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sources/sim"
)

// TestZeroSizedTerminalShowsTheLogLines: on a pty nobody gave a size (0×0:
// script without one, some CI runners, docker exec -t before its resize)
// the progress bars sized themselves to nothing: no bar was drawn, and a
// log line written above them, level=ERROR included, was lost about every
// other run, leaving only the final "backstop:" line. Such a terminal now
// gets the plain log lines. The binary runs under util-linux script, whose
// pty has no size when its input is not a terminal, several times over
// since the loss was a race.
func TestZeroSizedTerminalShowsTheLogLines(t *testing.T) {
	scriptPath, err := exec.LookPath("script")
	if err != nil {
		t.Skip("no script(1) to run the binary under a pty")
	}
	if v, err := exec.Command(scriptPath, "--version").CombinedOutput(); err != nil || !bytes.Contains(v, []byte("util-linux")) {
		t.Skip("script(1) is not util-linux's")
	}
	// The platform refuses the key: the sync fails on its first request.
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 10}, wrap: func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			w.Write([]byte(`{"error":{"code":"forbidden","message":"key revoked"}}`))
		})
	}})
	line := shellQuote(binPath) + " --config " + shellQuote(e.config) + " sync contacts"
	const runs = 8
	for i := range runs {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		// stty size shows the pty really is 0×0.
		cmd := exec.CommandContext(ctx, scriptPath, "-qec", "stty size; "+line, os.DevNull)
		cmd.Env = e.environ(e.sim.APIKey())
		out, _ := cmd.CombinedOutput() // exit 1: the sync failed
		cancel()
		text := string(out)
		if !strings.HasPrefix(text, "0 0") {
			t.Fatalf("the pty is not 0×0 (stty size first):\n%s", text)
		}
		if !strings.Contains(text, "backstop: sync: contacts") {
			t.Fatalf("run %d: the final line is missing:\n%s", i+1, text)
		}
		want := `level=ERROR msg="sync failed" resource=contacts`
		if !strings.Contains(text, want) {
			t.Fatalf("run %d of %d: the error log line is missing on a 0×0 terminal, want %q in:\n%s", i+1, runs, want, text)
		}
	}
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
