package store

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Restore puts a backup in place of a store: refused while the store is
// open, it moves the old store and the -wal a killed process left aside
// (never replaying that WAL into the backup), and the store then opened
// at the path is the backup's, sound, and no longer marked as a backup.
func TestRestore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "backstop.db")
	db, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		enqueue(t, db, "crm", fmt.Sprintf("evt_kept_%d", i), "payment.succeeded", t0)
	}
	backup := filepath.Join(t.TempDir(), "backup.db")
	if _, err := db.Backup(ctx, backup); err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		enqueue(t, db, "crm", fmt.Sprintf("evt_after_%d", i), "payment.succeeded", t0)
	}
	if _, err := Restore(ctx, backup, path, t0); !errors.Is(err, ErrStoreInUse) {
		t.Fatalf("restore while the store is open: %v, want ErrStoreInUse", err)
	}
	// A process killed now leaves its WAL: saved here, put back below.
	wal, err := os.ReadFile(path + "-wal")
	if err != nil || len(wal) == 0 {
		t.Fatalf("no WAL to leave behind: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+"-wal", wal, 0o600); err != nil {
		t.Fatal(err)
	}

	info, err := Restore(ctx, backup, path, t0)
	if err != nil {
		t.Fatal(err)
	}
	if info.Replaced == "" || info.Backup.TakenAt.IsZero() {
		t.Errorf("restore info %+v: want the old store's new name and the backup's time", info)
	}
	if _, err := os.Stat(path + "-wal"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a -wal is beside the restored store: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".backstop-restore-*")); len(left) != 0 {
		t.Errorf("restore left %v", left)
	}
	restored, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	if err := restored.r.Select(&ids, `SELECT event_id FROM outbox ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 50 || !strings.HasSuffix(ids[0], "evt_kept_0") {
		t.Errorf("the restored store holds %d rows (first %v), want the backup's 50", len(ids), ids[:min(1, len(ids))])
	}
	var stamps int
	if err := restored.r.Get(&stamps, `SELECT count(*) FROM backup_info`); err != nil || stamps != 0 {
		t.Errorf("the restored store is still marked as a backup: %d, %v", stamps, err)
	}
	if err := restored.Close(); err != nil {
		t.Fatal(err)
	}
	// The store it replaced is kept whole, with what came after the
	// backup.
	old, err := Open(ctx, info.Replaced, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := old.r.Get(&n, `SELECT count(*) FROM outbox`); err != nil || n != 550 {
		t.Errorf("the replaced store holds %d rows (%v), want 550", n, err)
	}
	old.Close()

	// A store deleted by hand with its -wal left: the -wal goes aside.
	fresh := filepath.Join(t.TempDir(), "backstop.db")
	if err := os.WriteFile(fresh+"-wal", wal, 0o600); err != nil {
		t.Fatal(err)
	}
	if info, err := Restore(ctx, backup, fresh, t0); err != nil || info.Replaced == "" {
		t.Errorf("restore beside a stray -wal: %+v, %v", info, err)
	}
	if _, err := os.Stat(fresh + "-wal"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the stray -wal is still beside the restored store: %v", err)
	}

	// A second restore in the same second keeps the store the first one
	// put in place, beside the first one's, under a name of its own; the
	// store's file mode is kept.
	if err := os.Chmod(path, 0o640); err != nil {
		t.Fatal(err)
	}
	again, err := Restore(ctx, backup, path, t0)
	if err != nil {
		t.Fatal(err)
	}
	if again.Replaced == info.Replaced || again.Replaced == "" {
		t.Errorf("the second restore moved the store aside as %q, the first as %q: want two names", again.Replaced, info.Replaced)
	}
	if st, err := os.Stat(info.Replaced); err != nil || st.Size() == 0 {
		t.Errorf("the first restore's store moved aside is gone: %v", err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o640 {
		t.Errorf("the restored store's mode: %v %v, want 0640 as the store it replaced", st.Mode(), err)
	}

	// Refused while a process that takes no claim (an sqlite3 shell) has
	// the store open; and while a restore runs, no backstop process opens
	// the store.
	shell := exec.Command(os.Args[0], "-test.run=^$")
	shell.Env = append(os.Environ(), holdStoreEnv+"="+path)
	stdin, err := shell.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := shell.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := shell.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "open\n" {
		t.Fatalf("the process holding the store open said %q, %v", line, err)
	}
	if _, err := Restore(ctx, backup, path, t0); !errors.Is(err, ErrStoreInUse) {
		t.Errorf("restore while an sqlite3 shell has the store open: %v, want ErrStoreInUse", err)
	}
	stdin.Close() // it exits
	if err := shell.Wait(); err != nil {
		t.Fatal(err)
	}
	release, err := Claim(ctx, path, openClaimName)
	if err != nil {
		t.Fatal(err)
	}
	if db, err := Open(ctx, path, Options{}); err == nil || !strings.Contains(err.Error(), "restore is replacing the store") {
		if db != nil {
			db.Close()
		}
		t.Errorf("open during a restore: %v, want it refused", err)
	}
	release()

	// Refused: the store itself, a file that is not a store, a backup of
	// a newer schema.
	if _, err := Restore(ctx, path, path, t0); err == nil || !strings.Contains(err.Error(), "the store itself") {
		t.Errorf("restore of the store onto itself: %v", err)
	}
	junk := filepath.Join(t.TempDir(), "junk.db")
	os.WriteFile(junk, []byte("not a database at all, but long enough to have a header of sorts......................................"), 0o600)
	if _, err := Restore(ctx, junk, path, t0); !errors.Is(err, ErrNotStore) {
		t.Errorf("restore of a file that is not a store: %v, want ErrNotStore", err)
	}
	newer := filepath.Join(t.TempDir(), "newer.db")
	data, _ := os.ReadFile(backup)
	os.WriteFile(newer, data, 0o600)
	nb, err := Open(ctx, newer, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nb.w.Exec(`INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, 'future', '2030-01-01T00:00:00Z')`); err != nil {
		t.Fatal(err)
	}
	nb.Close()
	if _, err := Restore(ctx, newer, path, t0); err == nil || !strings.Contains(err.Error(), "newer than this binary") {
		t.Errorf("restore of a newer schema: %v", err)
	}
}

// holdStoreEnv, set to a store's path, makes the test binary a process
// that holds that store open as an sqlite3 shell would (no claim taken,
// one read made): it says "open" and exits when its stdin closes.
const holdStoreEnv = "BACKSTOP_TEST_HOLD_STORE"

func TestMain(m *testing.M) {
	if path := os.Getenv(holdStoreEnv); path != "" {
		db, err := sql.Open("sqlite", path)
		if err == nil {
			var n int
			err = db.QueryRow(`SELECT count(*) FROM sqlite_master`).Scan(&n)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("open")
		io.Copy(io.Discard, os.Stdin)
		db.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}
