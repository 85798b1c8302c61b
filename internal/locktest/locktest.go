// Package locktest holds a SQLite store's write lock from outside the
// store, as another process would, for the tests of what backstop does
// meanwhile.
package locktest

import (
	"context"
	"database/sql"
	"sync"
	"testing"

	_ "modernc.org/sqlite" // the "sqlite" driver
)

// HoldWriteLock takes the write lock of the SQLite file at path (BEGIN
// IMMEDIATE) on a connection of its own, waiting up to 10 s for it, and
// returns what releases it. Release runs once; the test's end releases the
// lock too.
func HoldWriteLock(t testing.TB, path string) (release func()) {
	t.Helper()
	ctx := context.Background()
	raw, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := raw.Conn(ctx)
	if err != nil {
		raw.Close()
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		conn.Close()
		raw.Close()
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_, err := conn.ExecContext(ctx, "ROLLBACK")
			conn.Close()
			raw.Close()
			if err != nil {
				t.Errorf("release the write lock of %s: %v", path, err)
			}
		})
	}
	t.Cleanup(release)
	return release
}
