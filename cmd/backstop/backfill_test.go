package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources/sim"
)

// A plain backfill on a resource that is already syncing, and whose events
// a target subscribes to, is refused (exit 2, nothing read): it would write
// the changes since the last sync into the mirror without their events, and
// sync would then never emit them. Every change still reaches the outbox.
func TestPlainBackfillOnASyncingResourceIsRefused(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 12, Objects: 50}})
	base, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	e.writeConfig(string(base) + `targets:
  - {name: crm, url: "http://127.0.0.1:9/hook", allow_private: true, events: ["contact.*"]}
`)
	ctx := context.Background()
	if code, _, stderr := e.run(ctx, "sync", "contacts"); code != exitOK {
		t.Fatalf("sync: exit %d\n%s", code, stderr)
	}
	versions := map[string]bool{} // every contact version the targets must get
	for _, o := range e.sim.Objects(backstop.Contacts) {
		versions[backstop.EventID(backstop.DedupKey(backstop.Contacts, o.ID, o.UpdatedAt))] = true
	}
	changed := 0
	for _, o := range e.sim.Mutate(60) {
		if o.Resource == backstop.Contacts {
			changed++
		}
	}
	if changed == 0 {
		t.Fatal("the sim changed no contact")
	}
	for _, o := range e.sim.Objects(backstop.Contacts) {
		versions[backstop.EventID(backstop.DedupKey(backstop.Contacts, o.ID, o.UpdatedAt))] = true
	}

	requests := e.sim.Stats().Requests
	code, stdout, stderr := e.run(ctx, "backfill", "contacts")
	if code != exitUsage {
		t.Fatalf("plain backfill of a syncing resource: exit %d, want 2\n%s%s", code, stdout, stderr)
	}
	// The command it suggests is this one's with --emit: its --config too,
	// and its --restart (without which the suggestion read nothing).
	for _, want := range []string{"would lose events", "sync cursor", "crm", "`backstop --config " + e.config + " backfill contacts --emit`", "--no-emit"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, stderr)
		}
	}
	code, stdout, stderr = e.run(ctx, "backfill", "contacts", "--restart")
	if want := "`backstop --config " + e.config + " backfill contacts --restart --emit`"; code != exitUsage || !strings.Contains(stderr, want) {
		t.Errorf("plain backfill --restart of a syncing resource: exit %d, want 2 and %q in:\n%s%s", code, want, stdout, stderr)
	}
	if n := e.sim.Stats().Requests - requests; n != 0 {
		t.Errorf("the refused backfill made %d requests, want none", n)
	}
	// A resource no target subscribes to is backfilled as before.
	if code, _, stderr := e.run(ctx, "backfill", "payments"); code != exitOK {
		t.Fatalf("backfill payments (no subscriber): exit %d\n%s", code, stderr)
	}
	// The next sync emits every change: none was swallowed.
	if code, _, stderr := e.run(ctx, "sync", "contacts"); code != exitOK {
		t.Fatalf("sync: exit %d\n%s", code, stderr)
	}
	db := e.openStore()
	defer db.Close()
	rows, err := db.OutboxRows(ctx, "crm")
	if err != nil {
		t.Fatal(err)
	}
	queued := map[string]bool{}
	for _, r := range rows {
		queued[r.EventID] = true
	}
	missing := 0
	for k := range versions {
		if !queued[k] {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d contact versions never reached the crm outbox", missing, len(versions))
	}
	e.assertMirrorEqualsSim(backstop.Contacts)

	// --no-emit is the way to fill the mirror anyway, knowingly; with
	// --emit it is a usage error.
	if code, _, stderr := e.run(ctx, "backfill", "contacts", "--emit", "--no-emit"); code != exitUsage || !strings.Contains(stderr, "exclude each other") {
		t.Errorf("backfill --emit --no-emit: exit %d, want 2\n%s", code, stderr)
	}
	if code, _, stderr := e.run(ctx, "backfill", "contacts", "--no-emit"); code != exitOK {
		t.Errorf("backfill --no-emit: exit %d, want 0\n%s", code, stderr)
	}

	code, stdout, _ = e.run(ctx, "backfill", "--help")
	if code != exitOK || !strings.Contains(stdout, "refused") || !strings.Contains(stdout, "--emit") {
		t.Errorf("backfill --help does not explain when a backfill without --emit is refused:\n%s", stdout)
	}
}
