package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sources/sim"
)

// countLines counts the lines of out that contain every one of subs.
func countLines(out string, subs ...string) int {
	n := 0
	for l := range strings.SplitSeq(out, "\n") {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(l, s)
		}
		if all {
			n++
		}
	}
	return n
}

// reconcile and backstop run JOB (sync, backfill and reconcile jobs) show
// their progress as sync and backfill do: a progress line per resource
// every interval when no bars are drawn, and a line when each resource
// ends.
func TestReconcileAndRunJobShowProgress(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 14, Objects: 120}, pageSize: 10})
	e.withJobs()
	base, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	e.writeConfig(string(base) + `  - {name: chats-refill, kind: backfill, resources: [chats], every: 1h}
`)
	// Every page is due for a line (the default is every 5 s).
	t.Setenv("BACKSTOP_PROGRESS_INTERVAL", "1ns")
	ctx := context.Background()

	code, _, stderr := e.run(ctx, "reconcile", "--full", "payments", "contacts")
	if code != exitOK {
		t.Fatalf("reconcile: exit %d\n%s", code, stderr)
	}
	for _, r := range []string{"payments", "contacts"} {
		if n := countLines(stderr, "reconcile progress", "resource="+r, "scanned="); n < 2 {
			t.Errorf("reconcile %s: %d progress lines, want one per page:\n%s", r, n, stderr)
		}
		if n := countLines(stderr, "reconcile finished", "resource="+r, "scanned=120"); n != 1 {
			t.Errorf("reconcile %s: %d finished lines with its counts, want 1:\n%s", r, n, stderr)
		}
	}

	for _, job := range []struct{ name, op, resource string }{
		{"crm-nightly", "sync", "contacts"},
		{"payments-hourly", "reconcile", "payments"},
		{"chats-refill", "backfill", "chats"},
	} {
		code, _, stderr := e.run(ctx, "run", job.name)
		if code != exitOK {
			t.Fatalf("run %s: exit %d\n%s", job.name, code, stderr)
		}
		if n := countLines(stderr, job.op+" progress", "resource="+job.resource); n < 1 {
			t.Errorf("run %s: no %s progress line:\n%s", job.name, job.op, stderr)
		}
		// A feed's line says its rate and how far through the feed it
		// has read (the platform gives no total to make a percentage of).
		if job.op != "reconcile" && countLines(stderr, job.op+" progress", "resource="+job.resource, "objects_per_s=", "reached=20") < 1 {
			t.Errorf("run %s: no %s progress line with objects_per_s and reached:\n%s", job.name, job.op, stderr)
		}
		if n := countLines(stderr, job.op+" finished", "resource="+job.resource); n != 1 {
			t.Errorf("run %s: %d %s finished lines, want 1:\n%s", job.name, n, job.op, stderr)
		}
	}
}

// On a terminal, reconcile and run JOB draw a bar per resource, and end.
func TestReconcileAndRunJobDrawBars(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 15, Objects: 40}, pageSize: 10})
	e.withJobs()
	for _, args := range [][]string{
		{"reconcile", "--full", "payments"},
		{"run", "crm-nightly"},
		{"run", "payments-hourly"},
	} {
		var out, errb bytes.Buffer
		m := &Main{
			Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, IsTerminal: true,
			LookupEnv: func(k string) (string, bool) {
				if k == "BOTIX_API_KEY" {
					return e.sim.APIKey(), true
				}
				return "", false
			},
		}
		if code := m.Run(context.Background(), append([]string{"--config", e.config}, args...)); code != exitOK {
			t.Fatalf("%v: exit %d\n%s", args, code, errb.String())
		}
		op, resource := args[0], args[len(args)-1]
		switch resource {
		case "crm-nightly":
			op, resource = "sync", "contacts"
		case "payments-hourly":
			op, resource = "reconcile", "payments"
		}
		// Off a real terminal mpb cuts lines to the bar's width: the
		// name's start and the completion mark show.
		name := (op + " " + resource)[:12]
		if bar := errb.String(); countLines(bar, name, "✓") != 1 {
			t.Errorf("%v: no finished bar for %s %s on the terminal:\n%q", args, op, resource, bar)
		}
	}
}

// A run waiting on the rate limit between pages still logs a progress line
// every interval without bars: its totals as of its last page and how long
// ago that page was, so that a slow run does not look hung.
func TestProgressLinesWhileWaiting(t *testing.T) {
	// Two requests a second: the 6 pages take about 3 s, mostly waiting.
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 3, Objects: 60, Limit: 2, Window: time.Second}, pageSize: 10})
	t.Setenv("BACKSTOP_PROGRESS_INTERVAL", "200ms")
	code, _, stderr := e.run(context.Background(), "backfill", "contacts", "--no-emit")
	if code != exitOK {
		t.Fatalf("backfill: exit %d\n%s", code, stderr)
	}
	if n := countLines(stderr, "backfill progress", "resource=contacts", "since_last_page="); n < 2 {
		t.Errorf("%d progress lines while the backfill waited between pages, want some:\n%s", n, stderr)
	}
	if n := countLines(stderr, "backfill finished", "resource=contacts", "objects=60"); n != 1 {
		t.Errorf("%d finished lines, want 1:\n%s", n, stderr)
	}
}

// A job runs its resources one after another: while the first is read,
// the ones after it said they were "waiting for its first page", which
// reads like a stalled platform. They now say they are queued after the
// one going on.
func TestRunJobSaysWhichResourcesAreQueued(t *testing.T) {
	// Two requests a second: the 3 contacts pages take over a second.
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 5, Objects: 30, Limit: 2, Window: time.Second}, pageSize: 10})
	e.appendConfig("jobs:\n  - {name: two-sync, kind: sync, resources: [contacts, payments], every: 1h}\n")
	t.Setenv("BACKSTOP_PROGRESS_INTERVAL", "100ms")
	code, _, stderr := e.run(context.Background(), "run", "two-sync")
	if code != exitOK {
		t.Fatalf("run: exit %d\n%s", code, stderr)
	}
	if n := countLines(stderr, "sync progress", "resource=payments", "queued after contacts"); n < 1 {
		t.Errorf("no line saying payments is queued after contacts:\n%s", stderr)
	}
	before, _, _ := strings.Cut(stderr, `msg="sync finished" resource=contacts`)
	if n := countLines(before, "resource=payments", "for its first page"); n != 0 {
		t.Errorf("payments said it waited for its first page while queued behind contacts:\n%s", stderr)
	}
}
