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
	if code != exitOK || !regexp.MustCompile(`(?m)^note +already done, nothing read: contacts \(backstop backfill --restart RESOURCE reads one again\)$`).MatchString(stdout) {
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
