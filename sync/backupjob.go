package sync

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/backstop-sync/backstop"
)

// backupStamp is the time in a backup job's file names: UTC, to the
// second, so that names sort in time order.
const backupStamp = "20060102T150405Z"

// backup runs backup job j: it writes a copy of the store into j.Dir as
// <j.Name>-<time>.db, then deletes the job's older copies there beyond
// j.Keep (counted in c.Pruned) and temporary files that backups killed
// midway left a day or more ago. It returns the new file's path. Files of
// other names in the directory are never touched.
func (s *Scheduler) backup(ctx context.Context, j Job, c *backstop.JobCounts, log *slog.Logger) (string, error) {
	b, ok := s.opts.Store.(Backuper)
	if !ok { // check refused the job already
		return "", errors.New("this store cannot write backups")
	}
	if fi, err := os.Stat(j.Dir); err != nil {
		return "", fmt.Errorf("backup directory %s: %w", j.Dir, errors.Unwrap(err))
	} else if !fi.IsDir() {
		return "", fmt.Errorf("backup directory %s: not a directory", j.Dir)
	}
	// The files of killed backups there are removed by the backup
	// itself (store.Backup), before it writes.
	now := s.opts.Now().UTC()
	base := j.Name + "-" + now.Format(backupStamp)
	var path string
	var size int64
	for n := 0; ; n++ {
		// Two runs in one second (a scheduled run right after backstop
		// run) get a suffix rather than refusing.
		path = filepath.Join(j.Dir, base+".db")
		if n > 0 {
			path = filepath.Join(j.Dir, fmt.Sprintf("%s-%d.db", base, n))
		}
		var err error
		size, err = b.BackupTo(ctx, path)
		if errors.Is(err, fs.ErrExist) && n < 100 {
			continue
		}
		if err != nil {
			return "", err
		}
		break
	}
	log.Info("backup written", "file", path, "bytes", size)
	keep := j.Keep
	if keep == 0 {
		keep = DefaultBackupKeep
	}
	deleted, err := pruneBackups(j.Dir, j.Name, keep, path)
	c.Pruned += int64(len(deleted))
	for _, f := range deleted {
		log.Info("old backup deleted", "file", f)
	}
	if err != nil {
		return path, fmt.Errorf("backup written to %s, but pruning the older ones: %w", path, err)
	}
	return path, nil
}

// pruneBackups deletes, in dir, the backups of the job named job (the
// files <job>-<time>.db and <job>-<time>-<n>.db) but the newest keep by
// the time in their names, never written, the one just written (should a
// clock stepped back make older copies look newer). It returns the
// backups it deleted.
func pruneBackups(dir, job string, keep int, written string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	own := regexp.MustCompile(`^` + regexp.QuoteMeta(job) + `-(\d{8}T\d{6}Z)(?:-(\d+))?\.db$`)
	type backup struct {
		name  string
		stamp string
		n     int
	}
	var backups []backup
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() {
			continue
		}
		if m := own.FindStringSubmatch(name); m != nil {
			if _, err := time.Parse(backupStamp, m[1]); err != nil {
				continue
			}
			n := 0
			if m[2] != "" {
				fmt.Sscan(m[2], &n)
			}
			if filepath.Join(dir, name) != written {
				backups = append(backups, backup{name, m[1], n})
			}
		}
	}
	slices.SortFunc(backups, func(a, b backup) int {
		if c := strings.Compare(a.stamp, b.stamp); c != 0 {
			return c
		}
		return a.n - b.n
	})
	var deleted []string
	// The one written counts toward keep.
	for _, b := range backups[:max(len(backups)-(keep-1), 0)] {
		path := filepath.Join(dir, b.name)
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		deleted = append(deleted, path)
	}
	return deleted, errors.Join(errs...)
}
