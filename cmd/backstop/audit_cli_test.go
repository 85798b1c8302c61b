package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
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

// TestReadOnlyCommandsRefuseAStorePathWithNoDatabase: cursors, jobs and
// deliveries list, show and targets (and cursors reset, deliveries retry,
// redirect, purge and targets enable, and run of a maintenance or backup
// job) with a mistyped store.path used to
// create an empty database there and answer from it ("no cursors saved
// yet"). They now exit 2 naming the file, line and key, and create
// nothing; with the database there they work as before.
func TestReadOnlyCommandsRefuseAStorePathWithNoDatabase(t *testing.T) {
	dir := t.TempDir()
	cfg := "source:\n  base_url: http://127.0.0.1:1\n  api_key: k\nstore:\n  path: ./mirorr.db\n" +
		"targets:\n  - {name: crm, url: \"https://crm.example.com/hooks\"}\n" +
		"jobs:\n  - {name: nightly, kind: sync, cron: \"0 3 * * *\"}\n" +
		"  - {name: prune, kind: maintenance, cron: \"0 4 * * *\"}\n" +
		"  - {name: nightly-backup, kind: backup, cron: \"0 5 * * *\", dir: ./backups}\n"
	if err := os.WriteFile(filepath.Join(dir, "schedules.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "mirorr.db")
	commands := [][]string{{"cursors"}, {"cursors", "--json"}, {"jobs"}, {"deliveries", "list"}, {"deliveries", "show", "1"}, {"deliveries", "targets"},
		// They change only what is already there: with no database they
		// would report success on an empty one.
		{"cursors", "reset", "contacts"}, {"deliveries", "retry", "1"}, {"deliveries", "redirect", "1", "https://inspector.example.com/x"},
		{"deliveries", "purge", "--dead", "--before", "2026-01-01"}, {"backup", filepath.Join(dir, "backup.db")},
		{"deliveries", "targets", "enable", "crm"},
		// A backup job run on an empty store created there wrote copies
		// of it and, with keep, pruned the good backups away.
		{"run", "prune"}, {"run", "nightly-backup"}}
	if err := os.Mkdir(filepath.Join(dir, "backups"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, args := range commands {
		code, stdout, stderr := runBinaryFor(t, 30*time.Second, dir, nil, args...)
		want := "backstop: ./schedules.yaml:5: store.path: no database at mirorr.db: run backstop sync or serve first, or check store.path"
		if code != exitUsage || strings.TrimSpace(stderr) != want || stdout != "" {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 2 and %q", strings.Join(args, " "), code, stdout, stderr, want)
		}
		if matches, _ := filepath.Glob(db + "*"); len(matches) > 0 {
			t.Fatalf("%s created %v", strings.Join(args, " "), matches)
		}
		if backups, _ := os.ReadDir(filepath.Join(dir, "backups")); len(backups) > 0 {
			t.Fatalf("%s wrote a backup: %v", strings.Join(args, " "), backups)
		}
	}

	// An empty file there (touched, or cut short) is no store either:
	// SQLite would have made one of it.
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"cursors"}, {"jobs"}, {"deliveries", "list"}, {"backup", filepath.Join(dir, "backup.db")}} {
		code, _, stderr := runBinaryFor(t, 30*time.Second, dir, nil, args...)
		if want := "store.path: mirorr.db is an empty file, not a backstop store"; code != exitUsage || !strings.Contains(stderr, want) {
			t.Errorf("%s on an empty file: exit %d, stderr %q; want exit 2 and %q", strings.Join(args, " "), code, stderr, want)
		}
		if fi, err := os.Stat(db); err != nil || fi.Size() != 0 {
			t.Fatalf("%s on an empty file made it a store", strings.Join(args, " "))
		}
	}
	if err := os.Remove(db); err != nil {
		t.Fatal(err)
	}

	s, err := store.Open(context.Background(), db, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"cursors"}, {"jobs"}, {"deliveries", "list"}, {"deliveries", "targets"}} {
		if code, _, stderr := runBinaryFor(t, 30*time.Second, dir, nil, args...); code != exitOK {
			t.Errorf("%s with the database there: exit %d\n%s", strings.Join(args, " "), code, stderr)
		}
	}
}

// TestBadProgressIntervalIsRefused: a BACKSTOP_PROGRESS_INTERVAL that is
// not a positive duration ("abc", "-1s") used to be ignored, the run
// logging every 5s as if it were unset. It now exits 2 naming the variable
// and what it wants, before any platform request.
func TestBadProgressIntervalIsRefused(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 10}})
	key := "BOTIX_API_KEY=" + e.sim.APIKey()
	for _, c := range []struct{ value, command string }{{"abc", "sync"}, {"-1s", "sync"}, {"0", "backfill"}, {"abc", "reconcile"}} {
		code, _, stderr := runBinaryFor(t, 30*time.Second, e.dir, []string{key, "BACKSTOP_PROGRESS_INTERVAL=" + c.value}, c.command)
		want := `backstop: BACKSTOP_PROGRESS_INTERVAL "` + c.value + `": want a positive duration such as 5s or 1m`
		if code != exitUsage || !strings.HasPrefix(stderr, want) {
			t.Errorf("%s with BACKSTOP_PROGRESS_INTERVAL=%s: exit %d, stderr %q; want exit 2 and %q…", c.command, c.value, code, stderr, want)
		}
	}
	if n := e.sim.Stats().Requests; n != 0 {
		t.Errorf("%d platform requests made by refused runs", n)
	}
	code, _, stderr := runBinaryFor(t, time.Minute, e.dir, []string{key, "BACKSTOP_PROGRESS_INTERVAL=1s"}, "sync")
	if code != exitOK {
		t.Errorf("sync with BACKSTOP_PROGRESS_INTERVAL=1s: exit %d\n%s", code, stderr)
	}
}

// TestStoreInADirectoryTheUserCannotWrite: as a user who cannot write to
// store.path's directory, sync failed with SQLite's "attempt to write a
// readonly database (1544)" (exit 1), and jobs with "claim
// backstop.db.open-lock: unable to open database file", and serve with
// "claim b.db.serve-lock: attempt to write a readonly database". All now exit 2
// naming the file, line and key and saying what backstop needs there.
// It runs the binary as nobody, which takes root.
func TestStoreInADirectoryTheUserCannotWrite(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runs the binary as another user: needs root (CI runs as root)")
	}
	base, err := os.MkdirTemp("", "backstop-ro-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	bin := filepath.Join(base, "backstop")
	data, err := os.ReadFile(binPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := "source:\n  base_url: http://127.0.0.1:1\n  api_key: k\nstore:\n  path: ./ro/b.db\nintake:\n  secret: s\n"
	if err := os.WriteFile(filepath.Join(base, "schedules.yaml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(base, "ro"), 0o755); err != nil {
		t.Fatal(err)
	}
	// serve said "claim b.db.serve-lock: attempt to write a readonly
	// database (8)", exit 1: it claims the store before opening it.
	for _, args := range [][]string{{"sync", "contacts"}, {"serve"}, {"jobs"}} {
		if args[0] == "jobs" {
			// A store there, readable by all: jobs only reads it.
			s, err := store.Open(context.Background(), filepath.Join(base, "ro", "b.db"), store.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(filepath.Join(base, "ro"), 0o555); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(base, 0o755); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = base
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		err := cmd.Run()
		cancel()
		code := cmd.ProcessState.ExitCode()
		want := "backstop: ./schedules.yaml:5: store.path: this user cannot write to the directory ro: backstop creates the store and its -wal, -shm and lock files there, even to read it"
		if code != exitUsage || strings.TrimSpace(stderr.String()) != want {
			t.Errorf("%s as nobody: exit %d (%v), stderr %q; want exit 2 and %q", strings.Join(args, " "), code, err, stderr.String(), want)
		}
	}
}

// A store.path that names a directory is a configuration error naming the
// file, line and key, for every command: sync said "unable to open
// database file (14)", exit 1, and blamed the directory above it.
func TestStorePathThatIsADirectory(t *testing.T) {
	dir := t.TempDir()
	cfg := "source:\n  base_url: http://127.0.0.1:1\n  api_key: k\nstore:\n  path: ./data\nintake:\n  secret: s\n"
	if err := os.WriteFile(filepath.Join(dir, "schedules.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"sync", "contacts"}, {"serve"}, {"cursors"}} {
		code, _, stderr := runBinaryFor(t, 30*time.Second, dir, nil, args...)
		if want := "./schedules.yaml:5: store.path: data is a directory: name the store's file in it, such as data/backstop.db"; code != exitUsage || !strings.Contains(stderr, want) {
			t.Errorf("%s: exit %d, stderr %q; want exit 2 and %q", strings.Join(args, " "), code, stderr, want)
		}
	}
}
