package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	stdsync "sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/backstop-sync/backstop/sources/sim"
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

	// A restore: the backup in place of a store, read by the CLI.
	restoreDir := t.TempDir()
	restored := filepath.Join(restoreDir, "backstop.db")
	if err := os.WriteFile(restored, before, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	restoredCfg := filepath.Join(restoreDir, "schedules.yaml")
	if err := os.WriteFile(restoredCfg, []byte(strings.Replace(string(cfg), e.db, restored, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runBinary(t, restoreDir, env, "--config", restoredCfg, "deliveries", "list", "--json")
	var rows []deliveryRow
	if code != exitOK || json.Unmarshal([]byte(stdout), &rows) != nil || len(rows) == 0 {
		t.Errorf("deliveries list on the restored store: exit %d, %d rows\n%s", code, len(rows), stderr)
	}
}
