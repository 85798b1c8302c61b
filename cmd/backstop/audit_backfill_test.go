package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/backstop-sync/backstop"
	"github.com/backstop-sync/backstop/sources/sim"
)

// TestCursorsResetDuringSyncWins: `backstop cursors reset` run while a
// `backstop sync` of that resource was going used to be undone by the
// sync's next page, which wrote its cursor over the reset. Now the reset
// stands: the running sync stops that resource (exit 1) with a message that
// says its cursor was reset, and the next sync reads the feed from the
// start.
func TestCursorsResetDuringSyncWins(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 5, Objects: 600, Latency: 25 * time.Millisecond}, pageSize: 10})
	r := backstop.Contacts
	cmd, lines := e.startBinary("sync", string(r))
	// The sync has committed some pages, with many to go.
	db := e.openStore()
	waitFor(t, 30*time.Second, func() bool {
		c, ok, err := db.Cursor(context.Background(), r, backstop.CursorSync)
		return err == nil && ok && c.Position.Compare(e.sim.Objects(r)[49].Position()) >= 0
	})
	db.Close()
	if code, out, stderr := e.run(context.Background(), "cursors", "reset", string(r)); code != 0 {
		t.Fatalf("cursors reset: exit %d\n%s%s", code, out, stderr)
	}
	var all []string
	for l := range lines {
		all = append(all, l)
	}
	cmd.Wait()
	stderr := strings.Join(all, "\n")
	if code := cmd.ProcessState.ExitCode(); code != exitFailure {
		t.Fatalf("the sync across the reset exited %d, want 1 (the resource stopped)\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "sync contacts: its cursor was reset while it ran (by `backstop cursors reset contacts`)") {
		t.Errorf("the sync's error does not say its cursor was reset:\n%s", stderr)
	}
	code, out, stderr2 := e.run(context.Background(), "cursors", "--json")
	if code != 0 || strings.Contains(out, `"resource": "contacts"`) {
		t.Fatalf("cursors after the reset and the running sync: exit %d\n%s%s\nwant no contacts cursor (the reset stands)", code, out, stderr2)
	}
	// The next sync starts over and reads the whole feed.
	code, out, stderr2 = e.run(context.Background(), "sync", string(r), "--json")
	if code != 0 {
		t.Fatalf("sync after the reset: exit %d\n%s", code, stderr2)
	}
	if s := parseSummary(t, out); s.Resources[0].Objects != 600 {
		t.Errorf("sync after the reset read %d objects, want all 600 from the start", s.Resources[0].Objects)
	}
	e.assertMirrorEqualsSim(r)
}

// TestRunLabelsSyncEmitsEmitted: `backstop run` of a sync job printed the
// events the sync emitted as "re-emitted", the word for what a reconcile
// finds missed. A sync (and backfill) job's line is now "emitted"; a
// reconcile job's stays "re-emitted".
func TestRunLabelsSyncEmitsEmitted(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 9, Objects: 30}})
	e.appendConfig(`targets:
  - {name: crm, url: "http://127.0.0.1:1/hooks", allow_private: true, events: ["contact.*"]}
jobs:
  - {name: crm-nightly, kind: sync, resources: [contacts], cron: "0 3 * * *"}
  - {name: contacts-check, kind: reconcile, resources: [contacts], cron: "0 * * * *", full: true}
`)
	code, out, stderr := e.run(context.Background(), "run", "crm-nightly")
	if code != 0 {
		t.Fatalf("run crm-nightly: exit %d\n%s", code, stderr)
	}
	if !strings.Contains(out, "\nemitted     30\n") || strings.Contains(out, "re-emitted") {
		t.Errorf("run of a sync job that emitted 30 events:\n%s\nwant the line \"emitted     30\" and no \"re-emitted\"", out)
	}
	code, out, stderr = e.run(context.Background(), "run", "contacts-check")
	if code != 0 {
		t.Fatalf("run contacts-check: exit %d\n%s", code, stderr)
	}
	if !strings.Contains(out, "\nre-emitted  0\n") {
		t.Errorf("run of a reconcile job:\n%s\nwant the line \"re-emitted  0\"", out)
	}
}

// TestInterruptedBackfillSaysHowToResume: Ctrl-C in a backfill exited 130
// saying only that progress was saved, not what to run; the user had to
// know that running it again resumes, and that repeating --restart from
// the shell history would throw the progress away. It now prints the
// command that resumes (the resources that did not finish, without
// --restart), and that command reads only what is left.
func TestInterruptedBackfillSaysHowToResume(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 5, Objects: 600, Latency: 25 * time.Millisecond}, pageSize: 10})
	r := backstop.Contacts
	cmd, lines := e.startBinary("backfill", string(r), "--restart")
	db := e.openStore()
	waitFor(t, 30*time.Second, func() bool {
		_, ok, err := db.Cursor(context.Background(), r, backstop.CursorBackfill)
		return err == nil && ok
	})
	db.Close()
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	var all []string
	for l := range lines {
		all = append(all, l)
	}
	cmd.Wait()
	stderr := strings.Join(all, "\n")
	if code := cmd.ProcessState.ExitCode(); code != exitInterrupted {
		t.Fatalf("interrupted backfill exited %d, want 130\n%s", code, stderr)
	}
	want := "backstop: to resume, run `backstop --config " + e.config + " backfill contacts`"
	if !strings.Contains(stderr, want) {
		t.Fatalf("stderr does not say how to resume (%q):\n%s", want, stderr)
	}
	db = e.openStore()
	chk, _, err := db.Cursor(context.Background(), r, backstop.CursorBackfill)
	db.Close()
	if err != nil || chk.Done {
		t.Fatalf("checkpoint after Ctrl-C: %+v, %v; want an unfinished one", chk, err)
	}
	committed := 0
	for _, o := range e.sim.Objects(r) {
		if o.Position().Compare(chk.Position) <= 0 {
			committed++
		}
	}
	// The command it names (run here in-process, with the same arguments)
	// reads only what the interrupted run had not committed.
	code, out, errOut := e.run(context.Background(), "backfill", string(r), "--json")
	if code != 0 {
		t.Fatalf("resume: exit %d\n%s", code, errOut)
	}
	if got := parseSummary(t, out).Resources[0].Objects; got != 600-committed {
		t.Errorf("resumed backfill read %d objects, want the %d after the checkpoint", got, 600-committed)
	}
	e.assertMirrorEqualsSim(r)
}
