package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jmoiron/sqlx"
)

// BackupInfo describes a backup written by Backup.
type BackupInfo struct {
	// Path is the backup's file.
	Path string
	// Bytes is its size.
	Bytes int64
	// SchemaVersion is the store's schema version the backup has.
	SchemaVersion int
	// Duration is how long the backup took, its check included.
	Duration time.Duration
}

// Backup writes a consistent copy of the store to the new file dest, while
// other connections and processes go on writing: SQLite's VACUUM INTO,
// which copies the database as one read transaction saw it (the writers
// are not held up; the WAL is not checkpointed past that snapshot until it
// ends). The copy is a standalone file (no -wal to go with it), checked
// with PRAGMA quick_check and synced before it takes the name dest, so
// that dest is either a whole, checked backup or does not exist: it is
// built in a temporary file next to dest, removed on any failure or when
// ctx ends. dest must not exist (an error wrapping fs.ErrExist) and its
// directory must.
func (db *DB) Backup(ctx context.Context, dest string) (BackupInfo, error) {
	start := time.Now()
	info, err := db.backup(ctx, dest)
	if err != nil {
		return BackupInfo{}, fmt.Errorf("back up %s to %s: %w", db.path, dest, err)
	}
	info.Duration = time.Since(start)
	return info, nil
}

func (db *DB) backup(ctx context.Context, dest string) (info BackupInfo, err error) {
	if _, err := os.Lstat(dest); err == nil {
		return info, fmt.Errorf("%w: a backup is written to a new file", fs.ErrExist)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return info, err
	}
	dir := filepath.Dir(dest)
	f, err := os.CreateTemp(dir, ".backstop-backup-*.db")
	if err != nil {
		return info, err
	}
	tmp := f.Name()
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return info, err
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()

	// A connection of its own: the readers are query_only, which SQLite
	// takes to forbid VACUUM INTO too, and the writer is the intake's.
	src, err := sqlx.Open(driverName, db.path+"?_pragma=busy_timeout("+strconv.FormatInt(db.busy.Milliseconds(), 10)+")")
	if err != nil {
		return info, err
	}
	defer src.Close()
	src.SetMaxOpenConns(1)
	if _, err := src.ExecContext(ctx, `VACUUM INTO ?`, tmp); err != nil {
		if ctx.Err() != nil {
			return info, ctx.Err()
		}
		return info, fmt.Errorf("copy: %w", explainOpen(db.path, err))
	}
	if info.SchemaVersion, err = checkBackup(ctx, tmp); err != nil {
		return info, err
	}
	if err := syncFile(tmp); err != nil {
		return info, err
	}
	// A hard link takes the name only if it is still free (another
	// backup to the same name may have finished meanwhile).
	if err := os.Link(tmp, dest); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return info, fmt.Errorf("%w: it appeared while the backup was made", fs.ErrExist)
		}
		return info, err
	}
	os.Remove(tmp)
	if err := syncFile(dir); err != nil {
		return info, err
	}
	st, err := os.Stat(dest)
	if err != nil {
		return info, err
	}
	info.Path, info.Bytes = dest, st.Size()
	return info, nil
}

// checkBackup runs PRAGMA quick_check on the copy at path, read-only, and
// returns its schema version.
func checkBackup(ctx context.Context, path string) (int, error) {
	c, err := sqlx.Open(driverName, path+"?_pragma=query_only(1)")
	if err != nil {
		return 0, err
	}
	defer c.Close()
	var problems []string
	if err := c.SelectContext(ctx, &problems, `PRAGMA quick_check`); err != nil {
		return 0, fmt.Errorf("check the copy: %w", err)
	}
	if len(problems) != 1 || problems[0] != "ok" {
		return 0, fmt.Errorf("check the copy: %v", problems)
	}
	var version int
	if err := c.GetContext(ctx, &version, `SELECT coalesce(max(version), 0) FROM schema_migrations`); err != nil {
		return 0, fmt.Errorf("check the copy: read its schema version: %w", err)
	}
	return version, nil
}

// syncFile flushes the file or directory at path to the disk.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
