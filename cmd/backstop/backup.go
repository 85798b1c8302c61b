package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/backstop-sync/backstop/store"
)

func (m *Main) backupCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "backup FILE",
		Short: "Write a consistent copy of the store to a new file, while serve runs",
		Long: `backup writes a copy of the store (store.path) to FILE, a new file: the
mirror, cursors, processed events, outbox, delivery log and job history as
one moment saw them. It is safe while serve, sync or any job runs: the copy
is read in one read transaction (SQLite's VACUUM INTO), which holds up no
webhook's commit. FILE is built under a temporary name in its directory,
checked (PRAGMA quick_check) and flushed to the disk before it takes its
name, so FILE is a whole backup or does not exist. An existing FILE is
refused, never overwritten.

The backup records when it was taken ("as of"): it holds everything
committed before then. To put it back, see backstop restore --help.`,
		Example: `  backstop backup /var/backups/backstop-$(date +%F).db`,
		Args:    oneArg("the file to write the backup to, e.g. backstop backup /var/backups/backstop.db"),
		RunE: func(cmd *cobra.Command, args []string) error {
			dest := args[0]
			if strings.TrimSpace(dest) == "" {
				return usagef("backup: the file name is empty: name the backup's file, e.g. backstop backup /var/backups/backstop.db")
			}
			if fi, err := os.Stat(dest); err == nil && fi.IsDir() {
				return usagef("backup %s: that is a directory: name the backup's file, e.g. %s",
					dest, filepath.Join(dest, "backstop-"+time.Now().Format("2006-01-02")+".db"))
			}
			if fi, err := os.Stat(filepath.Dir(dest)); err != nil || !fi.IsDir() {
				return usagef("backup %s: directory %s does not exist", dest, filepath.Dir(dest))
			}
			db, cfg, err := m.openStore(cmd.Context(), g)
			if err != nil {
				return err
			}
			defer db.Close()
			if same, err := sameFile(cfg.Store.Path, dest); err == nil && same {
				return usagef("backup %s: that is the store itself (store.path)", dest)
			}
			info, err := db.Backup(cmd.Context(), dest)
			if errors.Is(err, fs.ErrExist) {
				return usagef("backup %s: the file exists; a backup is written to a new file: remove it or name another", dest)
			}
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSONOut(m.Stdout, struct {
					Store         string    `json:"store"`
					Backup        string    `json:"backup"`
					TakenAt       time.Time `json:"taken_at"`
					Bytes         int64     `json:"bytes"`
					SchemaVersion int       `json:"schema_version"`
					Seconds       float64   `json:"seconds"`
				}{cfg.Store.Path, info.Path, info.TakenAt, info.Bytes, info.SchemaVersion, info.Duration.Seconds()})
			}
			_, err = fmt.Fprintf(m.Stdout, "backed up %s to %s as of %s: %s, schema version %d, checked, in %s\n",
				cfg.Store.Path, info.Path, info.TakenAt.Format(time.RFC3339), byteSize(info.Bytes), info.SchemaVersion,
				info.Duration.Round(time.Millisecond))
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func (m *Main) restoreCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "restore BACKUP",
		Short: "Put a backup in place of the store (every backstop process on it stopped)",
		Long: `restore puts BACKUP, a file backstop backup wrote (or another copy of a
store), in place of the store at store.path. Stop every backstop process that
uses the store first: restore refuses while serve holds it, or while any
process (a sync, backfill, reconcile or run, an sqlite3 shell) has it open.

It checks BACKUP (PRAGMA quick_check; a backup of a newer backstop is
refused), copies it next to the store under a temporary name, with the
store's file mode (and owner, when run as root), and renames the copy into
place once it is written and synced, so that store.path always holds one
whole store. Backstop processes that start meanwhile refuse to open the
store until it is done. Nothing is deleted: the store that was there is kept
as store.path.replaced-<time> (its WAL folded into it first when it is
sound). Copying a backup over the store by hand is not the same: an old -wal
left beside it would be replayed into the backup, which it does not belong
to, and damage it.

The store is then as it was when the backup was taken: what was received
after it is not known, and deliveries still queued then are sent again (under
the same event ids, so a target that de-duplicates on webhook-id drops
them). restore prints the two commands that catch up: backstop sync (from
the backup's cursors), and backstop reconcile --since the backup's time,
which re-emits what changed after it (a target may get a version it already
had, under the reconcile's event id).`,
		Example: `  backstop restore /var/backups/backstop-2026-12-01.db`,
		Args:    oneArg("the backup file to restore, e.g. backstop restore /var/backups/backstop.db"),
		RunE: func(cmd *cobra.Command, args []string) error {
			backup := args[0]
			if fi, err := os.Stat(backup); err != nil {
				return usagef("restore %s: %v", backup, errors.Unwrap(err))
			} else if fi.IsDir() {
				return usagef("restore %s: that is a directory: name the backup's file", backup)
			}
			// Unreadable (permission denied): said here, not as SQLite's
			// "unable to open database file".
			f, err := os.Open(backup)
			if err != nil {
				return fmt.Errorf("restore %s: %w", backup, errors.Unwrap(err))
			}
			f.Close()
			cfg, err := m.loadConfig(g, true)
			if err != nil {
				return err
			}
			if same, err := sameFile(cfg.Store.Path, backup); err == nil && same {
				return usagef("restore %s: that is the store itself (store.path): name a backup of it", backup)
			}
			// serve's claim, held throughout: no serve starts on the
			// store while it is replaced.
			release, err := store.Claim(cmd.Context(), cfg.Store.Path, "serve")
			if errors.Is(err, store.ErrClaimed) {
				return fmt.Errorf("restore %s: serve is running on %s: stop every backstop process that uses the store first", backup, cfg.Store.Path)
			}
			if err != nil {
				return err
			}
			defer release()
			info, err := store.Restore(cmd.Context(), backup, cfg.Store.Path, time.Now())
			switch {
			case errors.Is(err, store.ErrNotStore):
				return usagef("restore %s: not a backstop store or backup: %v", backup, err)
			case err != nil:
				return err
			}
			if asJSON {
				var taken *time.Time
				if !info.Backup.TakenAt.IsZero() {
					taken = &info.Backup.TakenAt
				}
				return writeJSONOut(m.Stdout, struct {
					Store         string     `json:"store"`
					Backup        string     `json:"backup"`
					TakenAt       *time.Time `json:"taken_at"`
					SchemaVersion int        `json:"schema_version"`
					Replaced      string     `json:"replaced,omitempty"`
				}{cfg.Store.Path, backup, taken, info.Backup.SchemaVersion, info.Replaced})
			}
			w := m.Stdout
			// A copy that is not a backstop backup (a store set aside by a
			// restore, a copy made by hand) does not say when it was
			// taken: the whole feed is compared instead.
			asOf, window := "", "--full"
			if !info.Backup.TakenAt.IsZero() {
				asOf = " (taken " + info.Backup.TakenAt.Format(time.RFC3339) + ")"
				window = "--since " + info.Backup.TakenAt.Format(time.RFC3339)
			}
			fmt.Fprintf(w, "restored %s%s to %s\n", backup, asOf, cfg.Store.Path)
			if info.Replaced != "" {
				fmt.Fprintf(w, "the store it replaced is kept as %s (delete it once the restore is checked)\n", info.Replaced)
			}
			prefix := commandPrefix(cmd)
			if info.Backup.TakenAt.IsZero() {
				fmt.Fprintf(w, "%s is not a backstop backup, so when it was taken is unknown: the reconcile below compares the whole feed\n", backup)
			}
			_, err = fmt.Fprintf(w, "to catch up with what came after the backup, run:\n  %s sync\n  %s reconcile %s\n", prefix, prefix, window)
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

// sameFile reports whether paths a and b name one file (b need not exist).
func sameFile(a, b string) (bool, error) {
	fa, err := os.Stat(a)
	if err != nil {
		return false, err
	}
	fb, err := os.Stat(b)
	if err != nil {
		return false, err
	}
	return os.SameFile(fa, fb), nil
}

// byteSize renders n bytes for a person: 812 B, 4.2 KB, 13.0 MB, 2.1 GB.
func byteSize(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 2; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %cB", float64(n)/float64(div), "KMG"[exp])
}
