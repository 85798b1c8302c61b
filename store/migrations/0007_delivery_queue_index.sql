-- 0007: each target's queue read in claim order from an index of the queue
-- alone.
--
-- ClaimDue takes a target's due rows oldest first (next_attempt_at, then id).
-- With outbox_target_status_next (target, status, next_attempt_at) SQLite had
-- to gather every due row of both queued statuses and sort them on each
-- claim. outbox_due holds only the queued rows (pending or retrying, the
-- claim's own condition, so the planner uses it), in claim order (the rowid,
-- id, ends each entry), so a claim reads just the rows it takes, and the
-- delivered history does not weigh on it. Counting a target's rows by status
-- (TargetStates, deliveries list) needs only (target, status), which a lease
-- (a change of next_attempt_at) no longer touches.
CREATE INDEX outbox_due ON outbox (target, next_attempt_at)
    WHERE status = 'pending' OR status = 'retrying';
CREATE INDEX outbox_target_status ON outbox (target, status);
DROP INDEX outbox_target_status_next;
