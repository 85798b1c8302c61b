package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// A backup taken while another goroutine keeps queueing rows is a whole,
// checked store of the current schema, holding a prefix of those rows;
// a name already taken is refused and left as it was; a backup cut short
// leaves nothing behind.
func TestBackup(t *testing.T) {
	ctx := context.Background()
	db, _ := openTest(t)
	for i := range 200 {
		enqueue(t, db, "crm", fmt.Sprintf("evt_before_%d", i), "payment.succeeded", t0)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writeErr error
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := db.Enqueue(ctx, "crm", fmt.Sprintf("evt_during_%d", i), "payment.succeeded", []byte(`{"n":1}`), t0); err != nil {
				writeErr = err
				return
			}
		}
	})
	dir := t.TempDir()
	dest := filepath.Join(dir, "backup.db")
	info, err := db.Backup(ctx, dest)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if writeErr != nil {
		t.Fatalf("a write during the backup failed: %v", writeErr)
	}
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	latest := ms[len(ms)-1].version
	if info.Path != dest || info.Bytes <= 0 || info.SchemaVersion != latest || !info.TakenAt.Equal(t0) {
		t.Errorf("backup info %+v, want %s, its size, schema %d, taken when it began", info, dest, latest)
	}
	if read, err := ReadBackup(ctx, dest); err != nil || !read.TakenAt.Equal(info.TakenAt) || read.SchemaVersion != latest {
		t.Errorf("ReadBackup = %+v, %v; want the backup's time and schema", read, err)
	}
	if read, err := ReadBackup(ctx, db.path); err != nil || !read.TakenAt.IsZero() {
		t.Errorf("ReadBackup of a store in use = %+v, %v; want no backup time", read, err)
	}
	// A copy of the backup opens as a store (a restore is putting it in
	// place).
	data, err := os.ReadFile(dest)
	if err != nil {
		t.Fatal(err)
	}
	restored := filepath.Join(t.TempDir(), "restored.db")
	if err := os.WriteFile(restored, data, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := Open(ctx, restored, Options{})
	if err != nil {
		t.Fatalf("open the backup: %v", err)
	}
	defer b.Close()
	var inBackup, inStore []string
	if err := b.r.Select(&inBackup, `SELECT event_id FROM outbox ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	if err := db.r.Select(&inStore, `SELECT event_id FROM outbox ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	if len(inBackup) < 200 || len(inBackup) > len(inStore) || strings.Join(inBackup, ",") != strings.Join(inStore[:len(inBackup)], ",") {
		t.Errorf("the backup holds %d rows, not a prefix of the store's %d from the first 200 on", len(inBackup), len(inStore))
	}

	before, _ := os.ReadFile(dest)
	if _, err := db.Backup(ctx, dest); !errors.Is(err, fs.ErrExist) {
		t.Errorf("backup over an existing file: %v, want ErrExist", err)
	}
	if after, _ := os.ReadFile(dest); string(after) != string(before) {
		t.Error("a refused backup changed the existing file")
	}
	if _, err := db.Backup(ctx, filepath.Join(dir, "missing", "b.db")); err == nil {
		t.Error("backup into a missing directory: no error")
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := db.Backup(cancelled, filepath.Join(dir, "cut.db")); err == nil {
		t.Error("backup with its context ended: no error")
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 1 || names[0] != "backup.db" {
		t.Errorf("files left in the backup directory: %v, want only backup.db", names)
	}
}
