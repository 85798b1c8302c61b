package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/backstop-sync/backstop"
)

// BackupInfo describes a backup written by Backup.
type BackupInfo struct {
	// Path is the backup's file.
	Path string
	// Bytes is its size.
	Bytes int64
	// SchemaVersion is the store's schema version the backup has.
	SchemaVersion int
	// TakenAt is when the backup began: it holds everything committed
	// before then (and perhaps some of what came while it ran). It is
	// recorded in the backup (table backup_info); zero for a copy of a
	// store made otherwise.
	TakenAt time.Time
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

// backupTempPrefix begins the name of the file a backup is built in.
const backupTempPrefix = ".backstop-backup-"

// StaleBackupTemp is how old a temporary file of a backup that did not
// finish (killed) must be before a backup to its directory removes it.
const StaleBackupTemp = 24 * time.Hour

func (db *DB) backup(ctx context.Context, dest string) (info BackupInfo, err error) {
	if _, err := os.Lstat(dest); err == nil {
		return info, fmt.Errorf("%w: a backup is written to a new file", fs.ErrExist)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return info, err
	}
	dir := filepath.Dir(dest)
	// Before writing: a disk that killed backups filled must get its room
	// back for this one. A backup in progress writes its file all along,
	// so one untouched for a day is a killed backup's.
	// Best effort: a file that cannot be removed must not stop a backup.
	_ = removeTemps(dir, backupTempPrefix, db.now().Add(-StaleBackupTemp))
	f, err := os.CreateTemp(dir, backupTempPrefix+"*.db")
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

	// Everything committed before takenAt is in the copy: its read
	// transaction begins after.
	takenAt := db.now().UTC()
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
	if err := stampBackup(ctx, tmp, takenAt, db.path); err != nil {
		return info, err
	}
	if info, err = ReadBackup(ctx, tmp); err != nil {
		return info, err
	}
	if err := syncFile(tmp); err != nil {
		return info, err
	}
	// A hard link takes the name only if it is still free (another
	// backup to the same name may have finished meanwhile).
	if err := os.Link(tmp, dest); errors.Is(err, fs.ErrExist) {
		return info, fmt.Errorf("%w: it appeared while the backup was made", fs.ErrExist)
	} else if err != nil {
		// No hard links here (some network and USB file systems): a
		// rename, once the name is seen to be still free.
		if _, err := os.Lstat(dest); err == nil {
			return info, fmt.Errorf("%w: it appeared while the backup was made", fs.ErrExist)
		}
		if err := os.Rename(tmp, dest); err != nil {
			return info, err
		}
	} else {
		os.Remove(tmp)
	}
	if err := syncFile(dir); err != nil {
		return info, err
	}
	info.Path = dest
	return info, nil
}

// stampBackup records in the copy at path when it was taken, and from
// which store.
func stampBackup(ctx context.Context, path string, takenAt time.Time, source string) error {
	c, err := sqlx.Open(driverName, path)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, `INSERT OR REPLACE INTO backup_info (id, taken_at, source) VALUES (1, ?, ?)`,
		backstop.CanonicalTime(takenAt), source); err != nil {
		return fmt.Errorf("record the backup's time in the copy: %w", err)
	}
	return c.Close()
}

// ReadBackup checks the backup (or any copy of a store) at path, read-only
// (PRAGMA quick_check), and returns what it is: its size, schema version
// and, for a backup backstop backup wrote, when it was taken. It fails
// with an error wrapping ErrNotStore for a file that is not a backstop
// store, and on any problem the check finds.
func ReadBackup(ctx context.Context, path string) (BackupInfo, error) {
	info := BackupInfo{Path: path}
	st, err := os.Stat(path)
	if err != nil {
		return info, err
	}
	if st.IsDir() {
		return info, fmt.Errorf("%s is a directory", path)
	}
	info.Bytes = st.Size()
	c, err := sqlx.Open(driverName, path+"?_pragma=query_only(1)")
	if err != nil {
		return info, err
	}
	defer c.Close()
	var problems []string
	if err := c.SelectContext(ctx, &problems, `PRAGMA quick_check`); err != nil {
		if Damaged(err) {
			return info, fmt.Errorf("%w: %v", ErrNotStore, err)
		}
		return info, fmt.Errorf("check %s: %w", path, err)
	}
	if len(problems) != 1 || problems[0] != "ok" {
		return info, fmt.Errorf("check %s: it is damaged: %s", path, strings.Join(problems[:min(len(problems), 5)], "; "))
	}
	if err := c.GetContext(ctx, &info.SchemaVersion, `SELECT coalesce(max(version), 0) FROM schema_migrations`); err != nil {
		return info, fmt.Errorf("%w: %s has no schema_migrations table", ErrNotStore, path)
	}
	var taken []string
	if err := c.SelectContext(ctx, &taken, `SELECT taken_at FROM backup_info WHERE id = 1`); err == nil && len(taken) == 1 {
		if info.TakenAt, err = backstop.ParseTime(taken[0]); err != nil {
			return info, fmt.Errorf("%s: backup_info.taken_at: %w", path, err)
		}
	}
	return info, nil
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
