package sync

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// Pruning keeps the backup just written whatever the names around it say
// (a clock stepped back makes older copies look newer).
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

}
