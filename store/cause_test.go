package store

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/backstop-sync/backstop/internal/locktest"
)

// Cause names the condition behind a store error in words without the
// path or the driver's text, and nothing for errors it does not know.
func TestCause(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()

	// A file that is not a database.
	junk := filepath.Join(dir, "junk.db")
	if err := os.WriteFile(junk, []byte("this is not an SQLite database, just some text long enough to have a header........."), 0o600); err != nil {
		t.Fatal(err)
	}
	raw, err := sql.Open(driverName, junk)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_, err = raw.ExecContext(ctx, "CREATE TABLE t (x)")
	if got := Cause(err); got != "the store file is damaged, or not a backstop store" {
		t.Errorf("Cause(%v) = %q, want the store file is damaged, or not a backstop store", err, got)
	}

	// A write lock another connection holds.
	db, _ := openFull(t)
	defer locktest.HoldWriteLock(t, db.path)()
	second, err := sql.Open(driverName, db.path+"?_pragma=busy_timeout(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	_, err = second.ExecContext(ctx, "BEGIN IMMEDIATE")
	if got := Cause(err); got != "another process holds the store's write lock" {
		t.Errorf("Cause(%v) = %q, want the write lock", err, got)
	}

	for _, err := range []error{nil, errors.New("something else"), context.Canceled} {
		if got := Cause(err); got != "" {
			t.Errorf("Cause(%v) = %q, want empty", err, got)
		}
	}
}
