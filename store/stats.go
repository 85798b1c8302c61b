package store

import (
	"context"
	"fmt"
	"time"

	"github.com/backstop-sync/backstop"
)

// ProcessedByOrigin counts processed events by origin (webhook, sync,
// reconcile, …).
func (db *DB) ProcessedByOrigin(ctx context.Context) (map[backstop.Origin]int, error) {
	var rows []struct {
		Origin string `db:"origin"`
		N      int    `db:"n"`
	}
	if err := db.r.SelectContext(ctx, &rows, `SELECT origin, count(*) AS n FROM processed_events GROUP BY origin`); err != nil {
		return nil, fmt.Errorf("count processed events by origin: %w", err)
	}
	out := make(map[backstop.Origin]int, len(rows))
	for _, r := range rows {
		out[backstop.Origin(r.Origin)] = r.N
	}
	return out, nil
}

// JobFinish is when a job's last run with one status ended.
type JobFinish struct {
	Job        string
	Status     string
	FinishedAt time.Time
}

// LastJobFinishes returns, for every job and status in job_runs, when the
// last run of that job with that status ended (runs still running are left
// out), so that a process starting up can export when each job last ran
// before it.
func (db *DB) LastJobFinishes(ctx context.Context) ([]JobFinish, error) {
	var rows []struct {
		Job        string `db:"job"`
		Status     string `db:"status"`
		FinishedAt string `db:"finished_at"`
	}
	if err := db.r.SelectContext(ctx, &rows, `SELECT job, status, max(finished_at) AS finished_at FROM job_runs
		WHERE status <> 'running' AND finished_at IS NOT NULL GROUP BY job, status`); err != nil {
		return nil, fmt.Errorf("read the jobs' last runs: %w", err)
	}
	out := make([]JobFinish, 0, len(rows))
	for _, r := range rows {
		at, err := backstop.ParseTime(r.FinishedAt)
		if err != nil {
			return nil, fmt.Errorf("read the jobs' last runs: job %s: finished_at: %w", r.Job, err)
		}
		out = append(out, JobFinish{Job: r.Job, Status: r.Status, FinishedAt: at})
	}
	return out, nil
}

// DeadLetterCounts returns how many deliveries of each target in targets
// are dead letters, each counted on the outbox's (target, status) index,
// so that the cost follows the dead letters rather than the outbox.
func (db *DB) DeadLetterCounts(ctx context.Context, targets []string) (map[string]int, error) {
	out := make(map[string]int, len(targets))
	for _, t := range targets {
		var n int
		if err := db.r.GetContext(ctx, &n, `SELECT count(*) FROM outbox WHERE target = ? AND status = 'dead_letter'`, t); err != nil {
			return nil, fmt.Errorf("count dead letters of %s: %w", t, err)
		}
		out[t] = n
	}
	return out, nil
}
