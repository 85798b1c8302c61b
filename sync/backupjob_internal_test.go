package sync

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// Pruning keeps the backup just written whatever the names around it say
// (a clock stepped back makes older copies look newer), and the
// temporary files of killed backups, SQLite's journal among them, are
// removed before a backup is written, not only after one succeeds.
func TestPruneBackupsSparesTheOneWritten(t *testing.T) {
	dir := t.TempDir()
	touch := func(name string, at time.Time) string {
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
	now := time.Date(2026, 12, 1, 4, 15, 0, 0, time.UTC)
	later1 := touch("nightly-20261202T041500Z.db", now)
	later2 := touch("nightly-20261203T041500Z.db", now)
	written := touch("nightly-20261201T041500Z.db", now)
	deleted, err := pruneBackups(dir, "nightly", 2, written)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(deleted, []string{later1}) {
		t.Errorf("deleted %v, want only %s (keep 2, the one written among them)", deleted, later1)
	}
	for _, p := range []string{written, later2} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("kept backup gone: %v", err)
		}
	}

	stale := touch(".backstop-backup-1.db", now.Add(-48*time.Hour))
	journal := touch(".backstop-backup-1.db-journal", now.Add(-48*time.Hour))
	fresh := touch(".backstop-backup-2.db", now.Add(-time.Minute))
	if err := removeStaleTemps(dir, now); err != nil {
		t.Fatal(err)
	}
	for p, gone := range map[string]bool{stale: true, journal: true, fresh: false} {
		if _, err := os.Stat(p); (err != nil) != gone {
			t.Errorf("%s: stat %v, want removed=%v", filepath.Base(p), err, gone)
		}
	}
}
