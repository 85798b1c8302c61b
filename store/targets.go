package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// TargetsWithRows returns, in name order, every target that has at least
// one outbox row, whatever its status: the configured targets with a
// history, and the targets since removed from (or renamed in) the
// configuration whose rows are still kept.
func (db *DB) TargetsWithRows(ctx context.Context) ([]string, error) {
	var names []string
	if err := db.r.SelectContext(ctx, &names, `SELECT DISTINCT target FROM outbox ORDER BY target`); err != nil {
		return nil, fmt.Errorf("list targets with deliveries: %w", err)
	}
	return names, nil
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
