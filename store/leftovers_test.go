package store

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// touchAt writes a small file at dir/name, last written at.
func touchAt(t *testing.T, dir, name string, at time.Time) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, at, at); err != nil {
		t.Fatal(err)
	}
	return p
}

// wantFiles checks which of the files are there.
func wantFiles(t *testing.T, there map[string]bool) {
	t.Helper()
	for p, want := range there {
		_, err := os.Stat(p)
		if got := err == nil; got != want {
			t.Errorf("%s: there=%v, want %v (%v)", filepath.Base(p), got, want, err)
		}
	}
}

// A backup removes, in its directory, the files that backups killed
// midway left (and SQLite's journal beside one) once untouched for a day,
// before it writes: only the backup job did, so a manual backup killed
// left its file for good. A fresh one may be a backup going on, and
// other files are not its own.
func TestBackupRemovesTheFilesOfKilledBackups(t *testing.T) {
	db, clk := openTest(t)
	dir := t.TempDir()
	now := clk.Now()
	stale := touchAt(t, dir, ".backstop-backup-1.db", now.Add(-48*time.Hour))
	journal := touchAt(t, dir, ".backstop-backup-1.db-journal", now.Add(-48*time.Hour))
	fresh := touchAt(t, dir, ".backstop-backup-2.db", now.Add(-time.Hour))
	other := touchAt(t, dir, "nightly-20240101T000000Z.db", now.Add(-48*time.Hour))
	if _, err := db.Backup(context.Background(), filepath.Join(dir, "b.db")); err != nil {
		t.Fatal(err)
	}
	wantFiles(t, map[string]bool{stale: false, journal: false, fresh: true, other: true, filepath.Join(dir, "b.db"): true})
}

// A restore removes the copy that a restore of the same store, killed
// midway, left beside it, whatever its age (no other restore of the store
// can be going on), and not another store's.
func TestRestoreRemovesTheCopyOfAKilledRestore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "backstop.db")
	db, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "backup.db")
	if _, err := db.Backup(ctx, backup); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	own := touchAt(t, dir, restoreTempPrefix(path)+"3209008327.db", now)
	ownJournal := touchAt(t, dir, restoreTempPrefix(path)+"3209008327.db-journal", now)
	others := touchAt(t, dir, restoreTempPrefix(filepath.Join(dir, "other.db"))+"1.db", now)
	// The copy of a restore of backstop.db-2 going on beside it begins
	// with this store's prefix too: it is another store's.
	longer := touchAt(t, dir, restoreTempPrefix(filepath.Join(dir, "backstop.db-2"))+"77.db", now)
	if _, err := Restore(ctx, backup, path, now); err != nil {
		t.Fatal(err)
	}
	wantFiles(t, map[string]bool{own: false, ownJournal: false, others: true, longer: true})
}
