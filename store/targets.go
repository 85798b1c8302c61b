package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/backstop-sync/backstop"
)

// targetsWithRowsSQL lists the targets of the outbox in name order with a
// loose index scan: one index search per target, from the smallest name to
// the next one above the last, instead of a scan of every row (SELECT
// DISTINCT reads the whole index, millions of entries for a few names).
const targetsWithRowsSQL = `WITH RECURSIVE t(name) AS (
		SELECT (SELECT min(target) FROM outbox)
		UNION ALL
		SELECT (SELECT min(target) FROM outbox WHERE target > t.name) FROM t WHERE t.name IS NOT NULL)
	SELECT name FROM t WHERE name IS NOT NULL`

// targetSettingsSQL reads what target_state remembers of targets (the IN
// list is appended).
const targetSettingsSQL = `SELECT name, paused_until, disabled, disabled_reason, disabled_at FROM target_state WHERE name IN (`

// TargetsWithRows returns, in name order, every target that has at least
// one outbox row, whatever its status: the configured targets with a
// history, and the targets since removed from (or renamed in) the
// configuration whose rows are still kept. It searches the index once per
// target, whatever the number of rows.
func (db *DB) TargetsWithRows(ctx context.Context) ([]string, error) {
	var names []string
	if err := db.r.SelectContext(ctx, &names, targetsWithRowsSQL); err != nil {
		return nil, fmt.Errorf("list targets with deliveries: %w", err)
	}
	return names, nil
}

// UnconfiguredTargetNames returns the names of the targets that have
// outbox rows but are not one of configured, in name order, without
// counting their rows.
func (db *DB) UnconfiguredTargetNames(ctx context.Context, configured []string) ([]string, error) {
	names, err := db.TargetsWithRows(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(names, func(n string) bool { return slices.Contains(configured, n) }), nil
}

// TargetSettings returns the state of each of names, in the same order, as
// TargetStates does but without counting its rows (the counts are zero):
// its pause and whether it is disabled. It reads target_state alone, so
// its cost does not grow with the outbox.
func (db *DB) TargetSettings(ctx context.Context, names []string) ([]TargetState, error) {
	out := make([]TargetState, len(names))
	byName := make(map[string][]*TargetState, len(names))
	for i, n := range names {
		out[i].Name = n
		byName[n] = append(byName[n], &out[i])
	}
	for start := 0; start < len(names); start += maxIn {
		chunk := names[start:min(start+maxIn, len(names))]
		args := make([]any, len(chunk))
		for i, n := range chunk {
			args[i] = n
		}
		var states []struct {
			Name           string         `db:"name"`
			PausedUntil    sql.NullString `db:"paused_until"`
			Disabled       bool           `db:"disabled"`
			DisabledReason string         `db:"disabled_reason"`
			DisabledAt     sql.NullString `db:"disabled_at"`
		}
		if err := db.r.SelectContext(ctx, &states, targetSettingsSQL+placeholders(len(chunk))+`)`, args...); err != nil {
			return nil, fmt.Errorf("read target settings: %w", err)
		}
		for _, s := range states {
			var paused, disabledAt time.Time
			var err error
			if s.PausedUntil.Valid {
				if paused, err = backstop.ParseTime(s.PausedUntil.String); err != nil {
					return nil, fmt.Errorf("read target settings: %s: paused_until: %w", s.Name, err)
				}
			}
			if s.DisabledAt.Valid {
				if disabledAt, err = backstop.ParseTime(s.DisabledAt.String); err != nil {
					return nil, fmt.Errorf("read target settings: %s: disabled_at: %w", s.Name, err)
				}
			}
			for _, ts := range byName[s.Name] {
				ts.PausedUntil, ts.Disabled, ts.DisabledReason, ts.DisabledAt = paused, s.Disabled, s.DisabledReason, disabledAt
			}
		}
	}
	return out, nil
}

// UnconfiguredTargets returns the state, as TargetStates does, of every
// target that has outbox rows but is not one of configured, in name order.
// No worker serves such a target: its queued rows are never sent.
func (db *DB) UnconfiguredTargets(ctx context.Context, configured []string) ([]TargetState, error) {
	names, err := db.TargetsWithRows(ctx)
	if err != nil {
		return nil, err
	}
	names = slices.DeleteFunc(names, func(n string) bool { return slices.Contains(configured, n) })
	if len(names) == 0 {
		return nil, nil
	}
	return db.TargetStates(ctx, names)
}

// PurgeTarget deletes every outbox row of target, whatever its status,
// with their attempts, and forgets the target's pause and disabled state;
// it returns how many deliveries it deleted. It is meant for a target no
// longer in the configuration, whose rows no worker will ever send; the
// caller checks that. It deletes in short transactions: on error, the
// count says how many were deleted before it.
func (db *DB) PurgeTarget(ctx context.Context, target string) (int64, error) {
	if target == "" {
		return 0, errors.New("purge target: empty target")
	}
	var total int64
	for {
		n, err := db.execCount(ctx, `DELETE FROM outbox WHERE id IN (
			SELECT id FROM outbox WHERE target = ? LIMIT ?)`, target, pruneChunk)
		total += n
		if err != nil {
			return total, fmt.Errorf("purge deliveries of %s: %w", target, err)
		}
		if n < pruneChunk {
			break
		}
	}
	if _, err := db.w.ExecContext(ctx, `DELETE FROM target_state WHERE name = ?`, target); err != nil {
		return total, fmt.Errorf("purge deliveries of %s: target state: %w", target, err)
	}
	return total, nil
}
