-- 0013: cursor resets are counted, so a run that read a cursor before it
-- was reset cannot save its position over the reset.
--
-- cursor_resets: one row per (resource, kind) that was ever reset, with
-- the number of resets (generation) and when the last one was. A reset
-- deletes the cursor and adds one to its generation in one transaction; a
-- sync or backfill reads its cursor and the generation together, and its
-- page commits save only while the generation is still the one it read
-- (no row reads as generation 0). Before this migration a running sync's
-- next page wrote its cursor back over `backstop cursors reset`.
CREATE TABLE cursor_resets (
    resource   TEXT NOT NULL,
    kind       TEXT NOT NULL,
    generation INTEGER NOT NULL,
    reset_at   TEXT NOT NULL,
    PRIMARY KEY (resource, kind)
);
