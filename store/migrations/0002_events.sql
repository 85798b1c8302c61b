-- 0002: the emit path's durable side: processed_events (dedup) and outbox
-- (one row per event and delivery target).
--
-- Time columns hold backstop.CanonicalTime text, as in 0001, so text order is
-- time order.

-- One row per event ever accepted, whatever its origin. An insert that
-- conflicts on event_id or on dedup_key is a duplicate and changes nothing.
--
-- dedup_key is NULL while the event has no version: an unknown event type, a
-- truncated event whose object is not fetched yet, or a truncated event that
-- turned out, once fetched, to be a version another event already holds
-- (duplicate_of then names that event). Several NULLs never conflict.
-- truncated is 1 while the object is still to fetch; the fetch worker picks
-- such rows by next_fetch_at (NULL = due now).
CREATE TABLE processed_events (
    event_id         TEXT NOT NULL PRIMARY KEY,
    dedup_key        TEXT UNIQUE,
    type             TEXT NOT NULL,
    resource         TEXT NOT NULL DEFAULT '',
    object_id        TEXT NOT NULL DEFAULT '',
    updated_at       TEXT,
    origin           TEXT NOT NULL,
    created_at       TEXT NOT NULL,
    received_at      TEXT NOT NULL,
    truncated        INTEGER NOT NULL DEFAULT 0 CHECK (truncated IN (0, 1)),
    fetch_attempts   INTEGER NOT NULL DEFAULT 0,
    next_fetch_at    TEXT,
    last_fetch_error TEXT,
    duplicate_of     TEXT,
    data             TEXT NOT NULL
);
-- Pruning deletes by age.
CREATE INDEX processed_events_received_at ON processed_events (received_at);
-- The fetch worker's queue. Partial: only truncated rows are indexed, so the
-- intake does not pay for it on every other event.
CREATE INDEX processed_events_truncated_due ON processed_events (truncated, next_fetch_at)
    WHERE truncated = 1;

-- One row per (target, event): what delivery sends and how far it got.
--
-- event_id deliberately has no foreign key to processed_events: processed
-- ids are pruned after 30 days while a dead letter may be kept longer, and
-- webhook-proxy rows (POST /outbox/{target}) have no processed event at all.
-- The row therefore carries everything delivery needs: event_type and
-- payload, the envelope {"event_id","event","created_at","origin","data"}
-- built when the event was emitted.
CREATE TABLE outbox (
    id              INTEGER PRIMARY KEY,
    target          TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    payload         TEXT NOT NULL,
    -- Written with OR, not IN: SQLite builds an ephemeral table for an IN
    -- list in a CHECK on every insert, which costs the emit path dearly.
    status          TEXT NOT NULL DEFAULT 'pending'
                    CHECK (status = 'pending' OR status = 'retrying' OR status = 'delivered' OR status = 'dead_letter'),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TEXT NOT NULL,
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL,
    last_status     INTEGER,
    last_error      TEXT,
    UNIQUE (target, event_id)
);
-- Each target's queue of due rows.
CREATE INDEX outbox_target_status_next ON outbox (target, status, next_attempt_at);
