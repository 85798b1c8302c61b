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
	"syscall"
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
// while another process has the store open: a backstop process holds the
// store's open claim, shared, for as long as it has it open, and Restore
// holds it exclusively throughout, so none opens the store meanwhile
// either; any other process (an sqlite3 shell, an older backstop) is
// found by SQLite's exclusive lock, which cannot be had beside it. Nothing
// is deleted: the store that was there, its WAL folded into it first when
// it can be, is kept as path.replaced-<time> (with any -wal and -shm left).
// The copy is made under a temporary name in the store's directory, with
// the store's file mode (and owner, when run as root), and renamed into
// place once written and synced, so that the path always holds one whole
// store, the old or the new; an old -wal is never left beside the new one,
// where SQLite would replay it into a database it does not belong to.
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
	release, err := Claim(ctx, path, openClaimName)
	if errors.Is(err, ErrClaimed) {
		return info, fmt.Errorf("%w: a backstop process (serve, a sync, backfill, reconcile or run, a backup) has it open: stop it first", ErrStoreInUse)
	}
	if err != nil {
		return info, err
	}
	defer release()

	old, err := os.Stat(path)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return info, err
	}
	// The copy of a restore killed before: under the claim no other
	// restore of this store goes on, so it is a leftover, whatever its age.
	// Best effort: one that cannot be removed must not stop the restore.
	prefix := restoreTempPrefix(path)
	_ = removeTemps(filepath.Dir(path), prefix, time.Time{})
	tmp, err := copyBackup(ctx, backup, filepath.Dir(path), prefix, old)
	if err != nil {
		return info, err
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if exists {
		if err := exclusiveCheck(ctx, path); err != nil {
			return info, err
		}
	}

	// The store there, and any -wal or -shm even without it (a store
	// deleted by hand), go aside under one new name; the store by a hard
	// link, so that the path holds it until the copy replaces it.
	replaced, err := freeName(path+".replaced-"+now.UTC().Format("20060102T150405Z"), "", "-wal", "-shm")
	if err != nil {
		return info, err
	}
	moved := false
	if exists {
		if err := os.Link(path, replaced); err != nil {
			// No hard links here (some network and USB file systems):
			// the store is renamed aside, and the path is empty until the
			// copy's rename.
			if err := os.Rename(path, replaced); err != nil {
				return info, fmt.Errorf("move the store aside: %w", err)
			}
		}
		moved = true
	}
	for _, suffix := range []string{"-wal", "-shm"} {
		if _, err := os.Lstat(path + suffix); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := os.Rename(path+suffix, replaced+suffix); err != nil {
			return info, fmt.Errorf("move the store's %s aside: %w", suffix, err)
		}
		moved = true
	}
	if moved {
		info.Replaced = replaced
		if err := syncFile(filepath.Dir(path)); err != nil {
			return info, err
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return info, fmt.Errorf("put the copy in place: %w", err)
	}
	return info, syncFile(filepath.Dir(path))
}

// restoreTempPrefix begins the name of the copy a restore of the store at
// path builds beside it: the store's own, so that a restore removes the
// copies only of its store's killed restores.
func restoreTempPrefix(path string) string {
	return ".backstop-restore-" + filepath.Base(path) + "-"
}

// removeTemps removes, in dir, the regular files os.CreateTemp made from
// prefix+"*.db", and SQLite's journals beside them (isTemp), last written
// before before (any, when before is zero).
func removeTemps(dir, prefix string, before time.Time) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !isTemp(name, prefix) {
			continue
		}
		if fi, err := e.Info(); err != nil || (!before.IsZero() && !fi.ModTime().Before(before)) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// isTemp reports whether name is one os.CreateTemp made from prefix+"*.db"
// (or its journal): prefix, then only the digits CreateTemp puts for '*'.
// A restore's copy of another store whose name begins with this one's
// (backstop.db-2 beside backstop.db) has more after the prefix.
func isTemp(name, prefix string) bool {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return false
	}
	rest, ok = strings.CutSuffix(rest, ".db-journal")
	if !ok {
		rest, ok = strings.CutSuffix(rest, ".db")
	}
	return ok && rest != "" && strings.Trim(rest, "0123456789") == ""
}

// copyBackup copies the backup at backup to a new temporary file in dir,
// no longer marked as a backup, with the mode (and, for root, the owner)
// of old, the store it is to replace (when there is one), written and
// synced, and returns its name, which begins with prefix.
func copyBackup(ctx context.Context, backup, dir, prefix string, old fs.FileInfo) (tmp string, err error) {
	f, err := os.CreateTemp(dir, prefix+"*.db")
	if err != nil {
		return "", err
	}
	tmp = f.Name()
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	src, err := os.Open(backup)
	if err != nil {
		f.Close()
		return "", err
	}
	_, err = io.Copy(f, src)
	src.Close()
	if err == nil && old != nil {
		err = f.Chmod(old.Mode().Perm())
		if st, ok := old.Sys().(*syscall.Stat_t); ok && err == nil && os.Geteuid() == 0 {
			err = f.Chown(int(st.Uid), int(st.Gid))
		}
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("copy the backup: %w", err)
	}
	if err := unstampBackup(ctx, tmp); err != nil {
		return "", err
	}
	return tmp, syncFile(tmp)
}

// freeName returns name, or name with "-2", "-3"… added, the first for
// which no file name+suffix exists.
func freeName(name string, suffixes ...string) (string, error) {
	for i := 1; i < 1000; i++ {
		candidate := name
		if i > 1 {
			candidate = fmt.Sprintf("%s-%d", name, i)
		}
		free := true
		for _, suffix := range suffixes {
			if _, err := os.Lstat(candidate + suffix); err == nil {
				free = false
			} else if !errors.Is(err, fs.ErrNotExist) {
				return "", err
			}
		}
		if free {
			return candidate, nil
		}
	}
	return "", fmt.Errorf("no free name for the store moved aside after %s-999", name)
}

// exclusiveCheck fails with an error wrapping ErrStoreInUse while another
// connection has the store at path open, one of a process that does not
// take the open claim (an sqlite3 shell, an older backstop): it holds a
// shared lock, which the exclusive one this takes cannot be had beside,
// even when it idles.
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
			return fmt.Errorf("%w (an sqlite3 shell, or an older backstop): stop it first", ErrStoreInUse)
		case Damaged(err):
			return nil
		}
		return err
	}
	_, err = conn.ExecContext(ctx, `ROLLBACK`)
	return err
}

// unstampBackup makes the copy at path a store in use from now on: in WAL
// mode, as every store backstop opens is (a backup is a rollback-journal
// file), and with backup_info empty (a backup of a schema before 15 has no
// such table). Its WAL is folded in and removed as it closes.
func unstampBackup(ctx context.Context, path string) error {
	c, err := sqlx.Open(driverName, path)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetMaxOpenConns(1)
	if _, err := c.ExecContext(ctx, `PRAGMA journal_mode = WAL`); err != nil {
		return fmt.Errorf("prepare the copy: %w", err)
	}
	if _, err := c.ExecContext(ctx, `DELETE FROM backup_info`); err != nil && !strings.Contains(err.Error(), "no such table") {
		return fmt.Errorf("prepare the copy: %w", err)
	}
	return c.Close()
}
