-- 0011: a delivery counts its failed attempts apart from all its attempts.
--
-- The retry schedule and the dead-letter rule (DESIGN.md, Delivery: dead
-- letter after the 5th failed attempt) count only failed attempts: 5xx, a
-- timeout, a connection error, 3xx. A 429 is the target's flow control (it
-- pauses the target) and does not use up the delivery's retries; it is
-- still an attempt, numbered in X-Delivery-Attempt and in the attempt log
-- (attempts). failures is the count the schedule reads; retrying a
-- delivery (deliveries retry, retry --dead) sets it to 0 with attempts.
ALTER TABLE outbox ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;

-- Rows of earlier versions: their attempts less the 429s logged for them,
-- never below 0 (an attempt pruned from the log counts as a failure, and a
-- 429 logged before a manual retry as none: either way the row keeps at
-- most the retries it had). Delivered rows are history and keep 0.
UPDATE outbox SET failures = max(attempts - (SELECT count(*) FROM delivery_attempts AS a
        WHERE a.delivery_id = outbox.id AND a.redirect = 0 AND a.status_code = 429), 0)
WHERE attempts > 0 AND status <> 'delivered';
