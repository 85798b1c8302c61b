package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	stdsync "sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/backstop-sync/backstop/sources/sim"
	"github.com/backstop-sync/backstop/store"
)

// backstop backup while serve takes webhooks, both the real binary: the
// backup is a whole store holding a prefix of the accepted events (every
// event in it was accepted, the ones accepted before the backup began are
// all in it), and put in place of the store (a restore) it serves the CLI.
// An existing file and a missing directory are refused (exit 2), the
// existing file left as it was.
func TestBackupWhileServing(t *testing.T) {
	addr := freeAddr(t)
	e := newServeEnv(t, addr, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	env := append(e.environ(e.sim.APIKey()), "BOTIX_WEBHOOK_SECRET="+webhookSecret)
	proc, lines := e.startBinaryEnv(env, "serve")
	waitLines(t, lines, "serving", 1, stepTimeout)
	defer func() {
		proc.cmd.Process.Signal(syscall.SIGTERM)
		proc.cmd.Wait()
	}()

	url := "http://" + addr + "/webhooks/botix"
	post := func(i int) {
		code, body := postSigned(t, url, webhookSecret, paymentWebhook(fmt.Sprintf("evt_backup_%d", i), fmt.Sprintf("pay_%d", i)))
		if code != http.StatusOK {
			t.Errorf("webhook %d: %d %s", i, code, body)
		}
	}
	for i := range 100 {
		post(i)
	}
	// More webhooks while the backup runs.
	var sent atomic.Int64
	sent.Store(100)
	stop := make(chan struct{})
	var wg stdsync.WaitGroup
	wg.Go(func() {
		for i := 100; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			post(i)
			sent.Add(1)
		}
	})
	dir := t.TempDir()
	dest := filepath.Join(dir, "backstop-backup.db")
	code, stdout, stderr := runBinary(t, dir, env, "--config", e.config, "backup", dest)
	close(stop)
	wg.Wait()
	if code != exitOK || !strings.Contains(stdout, "backed up") || !strings.Contains(stdout, dest) || !strings.Contains(stdout, "checked") {
		t.Fatalf("backup: exit %d\n%s%s", code, stdout, stderr)
	}

	ids := func(path string) []string {
		t.Helper()
		db, err := sql.Open("sqlite", path+"?_pragma=query_only(1)")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		rows, err := db.Query(`SELECT event_id FROM processed_events ORDER BY rowid`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var id string
			rows.Scan(&id)
			out = append(out, id)
		}
		return out
	}
	backedUp := ids(dest)
	all := ids(e.db)
	if len(backedUp) < 100 || len(backedUp) > len(all) || !slices.Equal(backedUp, all[:len(backedUp)]) {
		t.Errorf("the backup holds %d events, not a prefix of the store's %d that has the first 100", len(backedUp), len(all))
	}
	t.Logf("%d webhooks sent, %d events in the store, %d in the backup", sent.Load(), len(all), len(backedUp))

	code, stdout, stderr = runBinary(t, dir, env, "--config", e.config, "backup", "--json", filepath.Join(dir, "second.db"))
	var report struct {
		Backup        string `json:"backup"`
		Bytes         int64  `json:"bytes"`
		SchemaVersion int    `json:"schema_version"`
	}
	if code != exitOK || json.Unmarshal([]byte(stdout), &report) != nil || report.Bytes <= 0 || report.SchemaVersion <= 0 {
		t.Errorf("backup --json: exit %d\n%s%s", code, stdout, stderr)
	}

	before, _ := os.ReadFile(dest)
	code, _, stderr = runBinary(t, dir, env, "--config", e.config, "backup", dest)
	if code != exitUsage || !strings.Contains(stderr, "the file exists") {
		t.Errorf("backup over an existing file: exit %d %s; want 2, saying it exists", code, stderr)
	}
	if after, _ := os.ReadFile(dest); string(after) != string(before) {
		t.Error("a refused backup changed the existing file")
	}
	code, _, stderr = runBinary(t, dir, env, "--config", e.config, "backup", filepath.Join(dir, "nowhere", "b.db"))
	if code != exitUsage || !strings.Contains(stderr, "does not exist") {
		t.Errorf("backup into a missing directory: exit %d %s; want 2", code, stderr)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".backstop-backup-*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}

	// restore refuses while serve runs; once serve is SIGKILLed (its -wal
	// left behind) it puts the backup in place, keeps the old store aside,
	// and says how to catch up; serve starts on it and takes webhooks.
	code, _, stderr = runBinary(t, dir, env, "--config", e.config, "restore", dest)
	if code != exitFailure || !strings.Contains(stderr, "serve is running") {
		t.Errorf("restore while serve runs: exit %d %s; want 1, saying serve runs", code, stderr)
	}
	if err := proc.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	proc.cmd.Wait()
	if _, err := os.Stat(e.db + "-wal"); err != nil {
		t.Fatalf("no -wal left by the killed serve: %v", err)
	}
	code, stdout, stderr = runBinary(t, dir, env, "--config", e.config, "restore", dest)
	if code != exitOK || !strings.Contains(stdout, "restored "+dest+" (taken ") || !strings.Contains(stdout, "backstop --config "+e.config+" reconcile --since ") ||
		!strings.Contains(stdout, ".replaced-") {
		t.Fatalf("restore: exit %d\n%s%s", code, stdout, stderr)
	}
	if got := ids(e.db); !slices.Equal(got, backedUp) {
		t.Errorf("the restored store holds %d events, want the backup's %d", len(got), len(backedUp))
	}
	proc, lines = e.startBinaryEnv(env, "serve")
	waitLines(t, lines, "serving", 1, stepTimeout)
	post(1_000_000)
	if code := getStatus(t, "http://"+addr+"/readyz"); code != http.StatusOK {
		t.Errorf("serve on the restored store: /readyz %d", code)
	}
	code, stdout, stderr = runBinary(t, dir, env, "--config", e.config, "deliveries", "list", "--json")
	var rows []deliveryRow
	if code != exitOK || json.Unmarshal([]byte(stdout), &rows) != nil || len(rows) == 0 {
		t.Errorf("deliveries list on the restored store: exit %d, %d rows\n%s", code, len(rows), stderr)
	}

	// The store set aside is a copy, not a backup: it says when it was
	// taken nowhere, and the catch-up compares the whole feed. The
	// command printed was "reconcile --since THE-BACKUP'S-TIME".
	if err := proc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	proc.cmd.Wait()
	aside, _ := filepath.Glob(e.db + ".replaced-*")
	var copyOf string
	for _, p := range aside {
		if !strings.HasSuffix(p, "-wal") && !strings.HasSuffix(p, "-shm") {
			copyOf = p
		}
	}
	if copyOf == "" {
		t.Fatalf("no store set aside: %v", aside)
	}
	code, stdout, stderr = runBinary(t, dir, env, "--config", e.config, "restore", copyOf)
	if code != exitOK || !strings.Contains(stdout, copyOf+" is not a backstop backup, so when it was taken is unknown") ||
		!strings.Contains(stdout, "backstop --config "+e.config+" reconcile --full\n") || strings.Contains(stdout, "THE-BACKUP") {
		t.Errorf("restore of the store set aside: exit %d\n%s%s", code, stdout, stderr)
	}
}

// A store whose file is damaged where the webhooks' commits write (here
// the processed_events index, as a WAL replayed into a file it does not
// belong to can leave it): serve opens it (the damage is not where it
// looks at start), and once a webhook commit finds the damage /readyz
// answers 503 store_damaged and keeps answering so. Before, after a failed
// commit /readyz made a test write elsewhere, which succeeded, and said
// ready.
func TestServeNotReadyOnADamagedStore(t *testing.T) {
	addr := freeAddr(t)
	e := newServeEnv(t, addr, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	env := append(e.environ(e.sim.APIKey()), "BOTIX_WEBHOOK_SECRET="+webhookSecret)
	if err := e.openStore().Close(); err != nil { // made, migrated, its WAL folded in
		t.Fatal(err)
	}
	raw, err := sql.Open("sqlite", e.db)
	if err != nil {
		t.Fatal(err)
	}
	var root, pageSize int64
	if err := raw.QueryRow(`SELECT rootpage FROM sqlite_master WHERE name = 'sqlite_autoindex_processed_events_1'`).Scan(&root); err != nil {
		t.Fatal(err)
	}
	if err := raw.QueryRow(`PRAGMA page_size`).Scan(&pageSize); err != nil {
		t.Fatal(err)
	}
	if err := raw.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(e.db, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	garbage := []byte(strings.Repeat("\xde\xad\xbe\xef", int(pageSize)/4))
	if _, err := f.WriteAt(garbage, (root-1)*pageSize); err != nil {
		t.Fatal(err)
	}
	f.Close()

	proc, lines := e.startBinaryEnv(env, "serve")
	defer func() {
		proc.cmd.Process.Signal(syscall.SIGTERM)
		proc.cmd.Wait()
	}()
	waitLines(t, lines, "serving", 1, stepTimeout)
	url := "http://" + addr + "/webhooks/botix"
	readyz := func() (int, string) {
		res, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body)
	}
	for i := range 3 {
		if code, body := postSigned(t, url, webhookSecret, paymentWebhook(fmt.Sprintf("evt_dmg_%d", i), "pay_1")); code != http.StatusServiceUnavailable {
			t.Errorf("webhook %d into the damaged index: %d %s, want 503", i, code, body)
		}
		if code, body := readyz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "store_damaged") {
			t.Errorf("/readyz after webhook %d: %d %s; want 503 store_damaged", i, code, body)
		}
	}
}

// A backup job (kind backup) run with backstop run writes a checked copy
// of the store into its directory under the job's name and the time, says
// where, stores the file with the run (backstop jobs --json), and keeps
// the newest `keep` of its copies: older ones of the job and temporary
// files that killed backups left a day ago go, every other file in the
// directory stays. A directory that is missing fails the run (exit 1)
// with a message naming it.
func TestBackupJob(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 3, Objects: 30}})
	dir := t.TempDir()
	e.appendConfig(fmt.Sprintf(`jobs:
  - {name: nightly-backup, kind: backup, cron: "15 4 * * *", dir: %q, keep: 2}
  - {name: lost-backup, kind: backup, cron: "15 4 * * *", dir: %q}
`, dir, filepath.Join(dir, "missing")))
	if code, _, stderr := e.run(t.Context(), "sync"); code != exitOK {
		t.Fatalf("sync: exit %d\n%s", code, stderr)
	}
	// Files the job must leave alone, and a temporary file of a backup
	// killed two days ago, which it removes; one of a backup that may be
	// going on now stays.
	keepFiles := []string{"notes.txt", "other-20260101T000000Z.db", "nightly-backup-latest.db", ".backstop-backup-recent.db"}
	for _, f := range append(keepFiles, ".backstop-backup-2932784452.db") {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-48 * time.Hour)
	if err := os.Chtimes(filepath.Join(dir, ".backstop-backup-2932784452.db"), old, old); err != nil {
		t.Fatal(err)
	}

	var written []string
	for i := range 3 {
		code, stdout, stderr := e.run(t.Context(), "run", "nightly-backup", "--json")
		if code != exitOK {
			t.Fatalf("run %d: exit %d\n%s%s", i, code, stdout, stderr)
		}
		var run struct {
			Status string `json:"status"`
			Output string `json:"output"`
			Counts struct {
				Pruned int `json:"pruned"`
			} `json:"counts"`
		}
		if err := json.Unmarshal([]byte(stdout), &run); err != nil {
			t.Fatalf("run %d: %v\n%s", i, err, stdout)
		}
		if run.Status != "ok" || filepath.Dir(run.Output) != dir || !strings.HasPrefix(filepath.Base(run.Output), "nightly-backup-") {
			t.Fatalf("run %d: %+v, want ok and a file nightly-backup-… in %s", i, run, dir)
		}
		if want := max(i-1, 0); run.Counts.Pruned != want {
			t.Errorf("run %d deleted %d older backups, want %d", i, run.Counts.Pruned, want)
		}
		info, err := store.ReadBackup(t.Context(), run.Output)
		if err != nil || info.TakenAt.IsZero() {
			t.Fatalf("run %d: backup %s: %+v, %v", i, run.Output, info, err)
		}
		written = append(written, run.Output)
	}
	for _, f := range written[1:] {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("newest backups: %v", err)
		}
	}
	if _, err := os.Stat(written[0]); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("oldest backup %s still there (%v), want it deleted with keep: 2", written[0], err)
	}
	for _, f := range keepFiles {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("a file not the job's own backup was touched: %v", err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, ".backstop-backup-2932784452.db")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a killed backup's temporary file of two days ago is still there (%v)", err)
	}
	// The backup holds the synced mirror.
	db, err := sql.Open("sqlite", written[2]+"?_pragma=query_only(1)")
	if err != nil {
		t.Fatal(err)
	}
	var contacts int
	if err := db.QueryRow(`SELECT count(*) FROM contacts`).Scan(&contacts); err != nil || contacts == 0 {
		t.Errorf("backup's contacts: %d (%v), want the synced ones", contacts, err)
	}
	db.Close()
	if got := e.jobsJSON("nightly-backup"); got.LastRun == nil || got.LastRun.Output != written[2] {
		t.Errorf("jobs --json: last run %+v, want output %s", got.LastRun, written[2])
	}
	code, stdout, _ := e.run(t.Context(), "run", "nightly-backup")
	if code != exitOK || !strings.Contains(stdout, "backup ") || !strings.Contains(stdout, " 1 older backups") {
		t.Errorf("run: exit %d\n%s", code, stdout)
	}

	// A failed run's summary does not claim "deleted 0 older backups", and
	// its "job finished" line says why it failed.
	code, stdout, stderr := e.run(t.Context(), "run", "lost-backup")
	if code != exitFailure || !strings.Contains(stdout, "failed") || strings.Contains(stdout, "older backups") ||
		!strings.Contains(stderr, "backup directory "+filepath.Join(dir, "missing")) || !strings.Contains(stderr, "no such file or directory") {
		t.Errorf("backup job into a missing directory: exit %d\n%s%s", code, stdout, stderr)
	}
	if !regexp.MustCompile(`level=WARN msg="job finished".* error=.*backup directory`).MatchString(stderr) {
		t.Errorf("the failed run's job finished line does not say why:\n%s", stderr)
	}
}

// Bad arguments to backup and restore are bad usage (exit 2) that says
// what is wrong: an empty file name ("rename ./.backstop-backup-….db :
// no such file or directory", exit 1), and the store itself given as the
// backup to restore ("the backup is the store itself", exit 1).
func TestBackupAndRestoreRefuseBadArguments(t *testing.T) {
	e := newEnv(t, envOpts{sim: sim.Options{Seed: 1, Objects: 1}})
	e.openStore().Close()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"backup", ""}, "backup: the file name is empty"},
		{[]string{"restore", e.db}, "that is the store itself (store.path): name a backup of it"},
	} {
		code, _, stderr := e.run(context.Background(), c.args...)
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("%q: exit %d %s; want 2 and %q", c.args, code, stderr, c.want)
		}
	}
}
