package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/internal/syncbuf"
	"github.com/backstop-sync/backstop/store"
)

// The demo loses webhooks, reconciles, and its check line is computed: the
// mirror ends equal to the platform, and every (object, version) reached the
// outbox exactly once across the webhook and reconcile origins.
func TestDemo(t *testing.T) {
	e := newEnv(t, envOpts{})
	path := filepath.Join(t.TempDir(), "demo.db")
	code, stdout, stderr := e.run(context.Background(), "demo", "--duration", "2s", "--objects", "300", "--rate", "300", "--store", path)
	if code != 0 {
		t.Fatalf("demo exit %d\n%s\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "mirror matches platform: yes") {
		t.Fatalf("no passing check line:\n%s", stdout)
	}
	for _, want := range []string{"webhooks lost", "duplicate webhooks suppressed", "reconcile: re-emitted", "dead 0, still queued 0"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, stdout)
		}
	}
	db, err := store.Open(context.Background(), path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	origins, err := db.ProcessedByOrigin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if origins[backstop.OriginWebhook] == 0 || origins[backstop.OriginReconcile] == 0 {
		t.Fatalf("events by origin %v: want both webhook and reconcile", origins)
	}
	rows, err := db.OutboxRows(context.Background(), "recorder")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, r := range rows {
		var env struct {
			Origin string `json:"origin"`
			Data   struct {
				ID        string `json:"id"`
				UpdatedAt string `json:"updated_at"`
			} `json:"data"`
		}
		if err := json.Unmarshal(r.Payload, &env); err != nil {
			t.Fatal(err)
		}
		ts, err := backstop.ParseTime(env.Data.UpdatedAt)
		if err != nil {
			continue // a truncated event's payload before completion
		}
		key := env.Data.ID + "@" + backstop.CanonicalTime(ts)
		if prev, dup := seen[key]; dup {
			t.Errorf("%s reached the outbox twice (%s and %s)", key, prev, env.Origin)
		}
		seen[key] = env.Origin
	}
	if len(seen) == 0 {
		t.Fatal("nothing reached the outbox")
	}
}

// A demo without --store printed "database /tmp/backstop-demo-…/demo.db"
// and removed it at exit, so whoever went to look at it found nothing: the
// line says the database is temporary (and how to keep one), and a database
// named with --store is said to be kept, and is.
func TestDemoSaysWhetherItKeepsItsDatabase(t *testing.T) {
	e := newEnv(t, envOpts{})
	dbPath := func(stdout string) (string, string) {
		first, _, _ := strings.Cut(stdout, "\n")
		_, rest, ok := strings.Cut(first, ", database ")
		if !ok {
			t.Fatalf("no database in the first line: %q", first)
		}
		path, note, _ := strings.Cut(rest, " ")
		return path, note
	}
	code, stdout, stderr := e.run(context.Background(), "demo", "--duration", "1s", "--objects", "30", "--rate", "20")
	if code != 0 {
		t.Fatalf("demo exit %d\n%s\n%s", code, stdout, stderr)
	}
	path, note := dbPath(stdout)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("temporary database %s after the demo: %v, want it removed", path, err)
	}
	if !strings.Contains(note, "temporary") || !strings.Contains(note, "removed at exit") || !strings.Contains(note, "--store") {
		t.Errorf("the demo's database line says %q of %s, which it removes at exit", note, path)
	}

	kept := filepath.Join(t.TempDir(), "demo.db")
	code, stdout, stderr = e.run(context.Background(), "demo", "--duration", "1s", "--objects", "30", "--rate", "20", "--store", kept)
	if code != 0 {
		t.Fatalf("demo --store exit %d\n%s\n%s", code, stdout, stderr)
	}
	if path, note := dbPath(stdout); path != kept || note != "(kept)" {
		t.Errorf("demo --store %s: database line says %s %q, want %s (kept)", kept, path, note, kept)
	}
	if _, err := os.Stat(kept); err != nil {
		t.Errorf("database kept with --store: %v", err)
	}
	// A directory that does not exist is bad usage, as in store.path: it
	// was exit 1, "unable to open database file … check that this user
	// can write to the directory".
	missing := filepath.Join(t.TempDir(), "nodir", "demo.db")
	code, _, stderr = e.run(context.Background(), "demo", "--duration", "1s", "--store", missing)
	if code != exitUsage || !strings.Contains(stderr, "directory "+filepath.Dir(missing)+" does not exist") {
		t.Errorf("demo --store in a missing directory: exit %d, %q; want 2 saying the directory does not exist", code, stderr)
	}
}

// Ctrl-C during the demo said "progress up to the last committed page is
// saved", the line of sync and backfill, though the demo removes its
// temporary store at exit; it now says it was interrupted, no more.
func TestDemoInterruptedSaysNothingIsSaved(t *testing.T) {
	e := newEnv(t, envOpts{})
	var out, errb syncbuf.Buffer
	m := &Main{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb, LookupEnv: func(k string) (string, bool) {
		if k == "BACKSTOP_CONFIG" {
			return "", false
		}
		return os.LookupEnv(k)
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- m.Run(ctx, []string{"--config", e.config, "demo", "--duration", "60s", "--objects", "30", "--rate", "20"})
	}()
	waitFor(t, 60*time.Second, func() bool { return strings.Contains(out.String(), "database ") })
	cancel()
	code := <-done
	if code != exitInterrupted {
		t.Fatalf("interrupted demo exit %d, want %d\n%s\n%s", code, exitInterrupted, out.String(), errb.String())
	}
	if last := strings.TrimSpace(errb.String()); !strings.HasSuffix(last, "backstop: interrupted") || strings.Contains(last, "saved") {
		t.Errorf("interrupted demo says:\n%s\nwant it to end with \"backstop: interrupted\" and claim nothing saved", last)
	}
}

// A --rate above what the intake takes on the machine left a backlog of
// webhooks that took longer than the demo's fixed 30 s wait for them, and
// the demo failed ("waiting for the platform's webhook retries: context
// deadline exceeded") though nothing was wrong; it now waits as long as
// webhooks are still being taken. The wait and the platform's retry steps
// are shortened here (the wait kept above the longest step, so that a retry
// pending does not outlast it), so that a backlog of 15,000 webhooks,
// seconds at a 2-core intake, outlasts the wait on a fast machine too
// (3,000 against a 2.5 s wait did not, on session 19's).
func TestDemoWaitsOutAWebhookBacklog(t *testing.T) {
	defer func(d time.Duration, r []time.Duration) { webhooksIdleWait, demoWebhookRetries = d, r }(webhooksIdleWait, demoWebhookRetries)
	webhooksIdleWait = 500 * time.Millisecond
	demoWebhookRetries = []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond}
	e := newEnv(t, envOpts{})
	code, stdout, stderr := e.run(context.Background(), "demo", "--duration", "1s", "--objects", "30", "--rate", "15000")
	if code != 0 || !strings.Contains(stdout, "mirror matches platform: yes") {
		t.Fatalf("demo with a webhook backlog: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "(the intake is still taking them)") {
		t.Errorf("the backlog did not outlast the wait, so this test proves nothing:\n%s", stdout)
	}
}
