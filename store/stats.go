package store

import (
	"context"
	"fmt"

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
