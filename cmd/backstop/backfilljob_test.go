package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/backstop-sync/backstop/sources/sim"
)

// A backfill job is one pass: once its backfill has finished, a run reads
// nothing. It said only "result ok" with every count 0; now the run's
// summary, backstop jobs and the stored run say it was done already.
func TestBackfillJobSaysItWasDoneAlready(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 3, Objects: 30}})
	e.appendConfig(`jobs:
  - {name: refill, kind: backfill, resources: [contacts], emit: true, cron: "0 0 * * *"}
`)
	ctx := context.Background()
	code, stdout, stderr := e.run(ctx, "run", "refill")
	if code != exitOK || strings.Contains(stdout, "already done") {
		t.Fatalf("first run: exit %d\n%s\n%s", code, stdout, stderr)
	}
	code, stdout, stderr = e.run(ctx, "run", "refill")
	if code != exitOK || !regexp.MustCompile(`(?m)^note +already done, nothing read: contacts \(backstop --config \S+ backfill RESOURCE --restart --emit reads one again\)$`).MatchString(stdout) {
		t.Errorf("second run: exit %d, want a note that contacts was done already\n%s\n%s", code, stdout, stderr)
	}
	code, stdout, _ = e.run(ctx, "run", "refill", "--json")
	if code != exitOK || !strings.Contains(stdout, `"output": "already done, nothing read: contacts`) {
		t.Errorf("run --json: exit %d\n%s", code, stdout)
	}
	if code, stdout, _ = e.run(ctx, "jobs"); code != exitOK || !strings.Contains(stdout, "ok: already done, nothing read") {
		t.Errorf("jobs: exit %d, want the last run's result to say it was done already\n%s", code, stdout)
	}
}

// A finished backfill's hint to read everything again gave a command that
// backstop then refused (a backfill without --emit on a resource syncing
// to a subscribed target): `backfill contacts --restart` exited 2 asking
// for --emit. The hint now says --emit where the restart needs it, in the
// log of backfill and in the note of a backfill job, and not where it does
// not (no target subscribes).
func TestFinishedBackfillHintsTheRestartThatRuns(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 3, Objects: 30}})
	ctx := context.Background()
	if code, _, stderr := e.run(ctx, "backfill", "contacts"); code != exitOK {
		t.Fatalf("first backfill: exit %d\n%s", code, stderr)
	}
	code, _, stderr := e.run(ctx, "backfill", "contacts")
	if code != exitOK || !strings.Contains(stderr, "backfill contacts --restart` reads everything again") {
		t.Errorf("backfill with no target: exit %d, want the hint without --emit\n%s", code, stderr)
	}

	e.appendConfig("targets:\n  - {name: crm, url: \"https://crm.example.com/hooks\", events: [\"contact.*\"]}\n" +
		"jobs:\n  - {name: refill, kind: backfill, resources: [contacts], cron: \"0 0 * * *\"}\n")
	if code, _, stderr := e.run(ctx, "sync", "contacts"); code != exitOK {
		t.Fatalf("sync: exit %d\n%s", code, stderr)
	}
	code, _, stderr = e.run(ctx, "backfill", "contacts")
	hint := regexp.MustCompile("`(backstop --config \\S+ backfill contacts --restart --emit)` reads everything again").FindStringSubmatch(stderr)
	if code != exitOK || hint == nil {
		t.Fatalf("backfill with a subscribed target: exit %d, want the hint with --emit\n%s", code, stderr)
	}
	if code, stdout, _ := e.run(ctx, "run", "refill"); code != exitOK || !strings.Contains(stdout, "backfill RESOURCE --restart --emit reads one again") {
		t.Errorf("run refill: exit %d, want the note with --emit\n%s", code, stdout)
	}
	// The hint runs.
	args := strings.Fields(hint[1])[3:] // after "backstop --config PATH"
	if code, _, stderr := e.run(ctx, args...); code != exitOK {
		t.Errorf("%s: exit %d\n%s", hint[1], code, stderr)
	}
}
