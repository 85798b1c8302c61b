-- 0017: a claim leaves a delivery in its place in the queue.
--
-- A claim used to lease a row by moving its next_attempt_at to the lease's
-- end (and, since 0014, claimed_until with it): a row whose process died
-- mid-attempt, or that a 429 held under its claim, was due again only
-- when the lease ended, and then behind every row queued meanwhile (with
-- concurrency 1 a target got an older version of an object after a newer
-- one). A claim now sets claimed_until alone; a row is due when
-- next_attempt_at has come and its claim, if any, has ended
-- (claimed_until NULL or past), so that a claim left by a dead process
-- ends with the row still in its own place, and a dispatcher that starts
-- alone on the store ends such claims at once (ClaimDue).
--
-- The rows a claim passes over (claimed, in flight or waiting in memory:
-- a few batches at the head of the queue) are told apart in the index, so
-- that a claim still reads from the table only the rows it takes; id is
-- in the index before claimed_until to keep the entries in claim order
-- (next_attempt_at, then id) without a sort.
DROP INDEX outbox_due;
CREATE INDEX outbox_due ON outbox (target, next_attempt_at, id, claimed_until)
    WHERE status = 'pending' OR status = 'retrying';
