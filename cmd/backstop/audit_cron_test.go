package main

import (
	"context"
	"strings"
	"testing"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources/sim"
)

// A backfill checkpoint the platform can no longer read names the command
// that reads the backfill again and keeps the sync cursor (backfill
// --restart, with the flag the user gave), not `cursors reset`, which
// would also throw the sync cursor away; and that command works. A sync
// job run with `backstop run` names `cursors reset` as `backstop sync` does.
func TestInvalidCursorHintFitsTheCommand(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 11, Objects: 60}})
	e.withJobs()
	ctx := context.Background()
	if code, _, stderr := e.run(ctx, "backfill", "contacts"); code != exitOK {
		t.Fatalf("first backfill: exit %d\n%s", code, stderr)
	}
	db := e.openStore()
	syncBefore, _, err := db.Cursor(ctx, backstop.Contacts, backstop.CursorSync)
	if err == nil {
		// An unfinished checkpoint at a cursor the platform cannot read, as
		// a backfill killed long ago leaves it after the platform rotated
		// its cursors.
		err = db.ResetCursor(ctx, backstop.Contacts, backstop.CursorBackfill)
	}
	if err == nil {
		_, err = db.AdvanceCursor(ctx, backstop.Cursor{Resource: backstop.Contacts, Kind: backstop.CursorBackfill,
			Value: "not-a-cursor", Position: e.sim.Objects(backstop.Contacts)[10].Position()})
	}
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	code, _, stderr := e.run(ctx, "backfill", "contacts", "--emit")
	if code != exitFailure {
		t.Fatalf("backfill at an unreadable checkpoint: exit %d, want 1\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "run `backstop backfill contacts --restart --emit` to start its feed over") ||
		strings.Contains(stderr, "cursors reset") {
		t.Fatalf("error does not name backfill --restart --emit (and only it):\n%s", stderr)
	}
	if code, _, stderr := e.run(ctx, "backfill", "contacts", "--restart", "--emit"); code != exitOK {
		t.Fatalf("the hinted command: exit %d\n%s", code, stderr)
	}
	db = e.openStore()
	syncAfter, _, err := db.Cursor(ctx, backstop.Contacts, backstop.CursorSync)
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if syncAfter.Position.Compare(syncBefore.Position) < 0 || syncAfter.Value == "" {
		t.Errorf("sync cursor went from %v to %v", syncBefore.Position, syncAfter.Position)
	}
	e.assertMirrorEqualsSim(backstop.Contacts)

	e.sim.InvalidateCursors()
	code, _, stderr = e.run(ctx, "run", "crm-nightly")
	if code != exitFailure {
		t.Fatalf("run crm-nightly at an unreadable cursor: exit %d, want 1\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "run `backstop cursors reset contacts` to start its feed over") {
		t.Errorf("run crm-nightly does not say how to start over:\n%s", stderr)
	}
}
