package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// ErrStoreInUse is returned by Restore, wrapped, while another process
// has the store open.
var ErrStoreInUse = errors.New("another process has the store open")

// RestoreInfo describes what Restore did.
type RestoreInfo struct {
	// Backup is the backup put in place, as ReadBackup found it.
	Backup BackupInfo
	// Replaced is where the store that was at the path was moved, its
	// -wal and -shm files beside it with the same name; "" when there
	// was none.
	Replaced string
}

// Restore puts the backup at backup in place of the store at path: the
// store a process would open there from then on is a copy of the backup.
// It checks the backup first (ReadBackup; a schema newer than this
// binary's is refused), and refuses, with an error wrapping ErrStoreInUse,
// while another process has the store open (SQLite's exclusive lock cannot
// be taken). Nothing is deleted: the store that was there, with its -wal
// (folded into it first when it can be) and -shm files, is renamed to
// path.replaced-<time>. The copy is made under a temporary name in the
// store's directory and renamed into place once written and synced, so
// that a crash leaves either store, never a mix; in particular an old
// -wal is never left beside the restored file, where SQLite would replay
// it into a database it does not belong to. The caller keeps processes of
// its own from starting meanwhile (serve's claim).
func Restore(ctx context.Context, backup, path string, now time.Time) (RestoreInfo, error) {
	info, err := restore(ctx, backup, path, now)
	if err != nil {
		return info, fmt.Errorf("restore %s to %s: %w", backup, path, err)
	}
	return info, nil
}

func restore(ctx context.Context, backup, path string, now time.Time) (info RestoreInfo, err error) {
	if a, errA := os.Stat(backup); errA == nil {
		if b, errB := os.Stat(path); errB == nil && os.SameFile(a, b) {
			return info, errors.New("the backup is the store itself")
		}
	}
	if info.Backup, err = ReadBackup(ctx, backup); err != nil {
		return info, err
	}
	ms, err := migrations()
	if err != nil {
		return info, err
	}
	if latest := ms[len(ms)-1].version; info.Backup.SchemaVersion > latest {
		return info, fmt.Errorf("the backup's schema version %d is newer than this binary's %d: restore it with the backstop that made it", info.Backup.SchemaVersion, latest)
	}

	exists := true
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		exists = false
	} else if err != nil {
		return info, err
	}
	if exists {
		if err := exclusiveCheck(ctx, path); err != nil {
			return info, err
		}
	}

	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".backstop-restore-*.db")
	if err != nil {
		return info, err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	src, err := os.Open(backup)
	if err != nil {
		f.Close()
		return info, err
	}
	_, err = io.Copy(f, src)
	src.Close()
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return info, fmt.Errorf("copy the backup: %w", err)
	}
	if err := unstampBackup(ctx, tmp); err != nil {
		return info, err
	}
	if err := syncFile(tmp); err != nil {
		return info, err
	}

	// The store there, and any -wal or -shm even without it (a store
	// deleted by hand), go aside under one name.
	replaced := path + ".replaced-" + now.UTC().Format("20060102T150405Z")
	moved := false
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if _, err := os.Lstat(path + suffix); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := os.Rename(path+suffix, replaced+suffix); err != nil {
			return info, fmt.Errorf("move the store aside: %w", err)
		}
		moved = true
	}
	if moved {
		info.Replaced = replaced
	}
	if err := os.Rename(tmp, path); err != nil {
		return info, fmt.Errorf("put the copy in place: %w", err)
	}
	return info, syncFile(dir)
}

// exclusiveCheck fails with an error wrapping ErrStoreInUse while another
// connection has the store at path open (it holds a shared lock, which
// the exclusive one this takes cannot be had beside, even when it idles).
// Its connection, the last one, then folds the store's WAL into the file
// as it closes. A file too damaged to lock is let through: nothing can be
// using it.
func exclusiveCheck(ctx context.Context, path string) error {
	c, err := sqlx.Open(driverName, path+"?_pragma=busy_timeout(0)&_pragma=locking_mode(EXCLUSIVE)")
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetMaxOpenConns(1)
	conn, err := c.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `BEGIN EXCLUSIVE`); err != nil {
		switch {
		case isBusy(err):
			return fmt.Errorf("%w (serve, a sync, backfill, reconcile or run, or an sqlite3 shell): stop it first", ErrStoreInUse)
		case Damaged(err):
			return nil
		}
		return err
	}
	_, err = conn.ExecContext(ctx, `ROLLBACK`)
	return err
}

// unstampBackup empties backup_info in the copy at path, which is a store
// in use from now on (a backup of a schema before 15 has no such table).
func unstampBackup(ctx context.Context, path string) error {
	c, err := sqlx.Open(driverName, path)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, `DELETE FROM backup_info`); err != nil && !strings.Contains(err.Error(), "no such table") {
		return fmt.Errorf("prepare the copy: %w", err)
	}
	return c.Close()
}
