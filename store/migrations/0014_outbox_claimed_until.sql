-- 0014: a claimed delivery says so until its attempt is recorded.
--
-- claimed_until: the end of the lease of the claim whose attempt is in
-- flight (ClaimDue sets it with next_attempt_at), cleared when the
-- attempt's outcome is recorded or the claim released. A Retry of a
-- delivery whose attempt is in flight used to make it due at once, so it
-- was sent a second time even when that attempt succeeded; a Retry is now
-- refused while claimed_until is ahead (a process killed mid-attempt
-- leaves it, and the row is due again when it passes, as before).
ALTER TABLE outbox ADD COLUMN claimed_until TEXT;
