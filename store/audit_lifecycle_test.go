package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jmoiron/sqlx"
)

// A store path that names another application's SQLite database (a typo
// in store.path, a shared data directory) or a file that is not SQLite is
// refused with an error naming the path, and the file is left byte for
// byte as it was: no backstop tables, no switch to WAL mode.
func TestOpenRefusesAnotherApplicationsDatabase(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		fill   []string // statements run on a new SQLite file; nil: text
		reason string   // in the error
	}{
		{"tables of another application", []string{
			`CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)`,
			`INSERT INTO customers (name) VALUES ('Ann')`,
			`CREATE TABLE invoices (id INTEGER PRIMARY KEY, total INTEGER)`,
		}, "customers, invoices"},
		{"another tool's schema_migrations", []string{
			`CREATE TABLE schema_migrations (version TEXT NOT NULL PRIMARY KEY)`,
			`INSERT INTO schema_migrations VALUES ('20240101120000')`,
			`CREATE TABLE users (id INTEGER PRIMARY KEY)`,
		}, "schema_migrations"},
		{"not SQLite", nil, "not an SQLite database"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "other.db")
			if tc.fill == nil {
				if err := os.WriteFile(path, bytes.Repeat([]byte("not a database, just some text\n"), 200), 0o600); err != nil {
					t.Fatal(err)
				}
			} else {
				w, err := sqlx.Open(driverName, path)
				if err != nil {
					t.Fatal(err)
				}
				for _, q := range tc.fill {
					if _, err := w.ExecContext(ctx, q); err != nil {
						t.Fatalf("%s: %v", q, err)
					}
				}
				if err := w.Close(); err != nil {
					t.Fatal(err)
				}
			}
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			db, err := Open(ctx, path, Options{})
			if err == nil {
				db.Close()
				t.Fatal("Open succeeded; want it refused")
			}
			if !errors.Is(err, ErrNotStore) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("Open error %q; want ErrNotStore naming %s and %q", err, path, tc.reason)
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Errorf("the refused file was changed (%d bytes before, %d after)", len(before), len(after))
			}
		})
	}
	// An empty file is a new store.
	path := filepath.Join(t.TempDir(), "empty.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatalf("Open of an empty file: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// Processes that start on one new file at once all open it: none takes
// the schema another is creating for another application's.
func TestOpenNewFileFromManyAtOnce(t *testing.T) {
	for round := range 3 {
		path := filepath.Join(t.TempDir(), "n.db")
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				db, err := Open(context.Background(), path, Options{})
				errs[i] = err
				if err == nil {
					db.Close()
				}
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("round %d opener %d: %v", round, i, err)
			}
		}
	}
}
