package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
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

To restore: stop every backstop process that uses the store, put the backup
at store.path, delete the old store's -wal and -shm files next to it, and
start again. The store is then as it was at the backup: deliveries still
queued then are sent again (under the same event ids, so a target that
de-duplicates on webhook-id drops them), and what was received after it is
not known. Run backstop sync (it resumes from the backup's cursors) and
backstop reconcile --since the backup's time, which re-emits the events
missed since; a target may then get a version it already had, under the
reconcile's event id.`,
		Example: `  backstop backup /var/backups/backstop-$(date +%F).db`,
		Args:    cobraArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			dest := args[0]
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
				enc := json.NewEncoder(m.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(struct {
					Store         string  `json:"store"`
					Backup        string  `json:"backup"`
					Bytes         int64   `json:"bytes"`
					SchemaVersion int     `json:"schema_version"`
					Seconds       float64 `json:"seconds"`
				}{cfg.Store.Path, info.Path, info.Bytes, info.SchemaVersion, info.Duration.Seconds()})
			}
			_, err = fmt.Fprintf(m.Stdout, "backed up %s to %s: %s, schema version %d, checked, in %s\n",
				cfg.Store.Path, info.Path, byteSize(info.Bytes), info.SchemaVersion, info.Duration.Round(time.Millisecond))
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
