-- 0005: outbound delivery: the attempt log and each target's state.
--
-- Time columns hold backstop.CanonicalTime text, as in 0001, so text order is
-- time order.

-- One row per HTTP attempt of a delivery (an outbox row), including manual
-- redirects to another URL (redirect = 1), which leave the delivery itself
-- unchanged. status_code is 0 when nothing answered; body is the first 4 KiB
-- of the response. Attempts go with their delivery when it is purged, and are
-- pruned by age (DESIGN.md: kept 14 days).
CREATE TABLE delivery_attempts (
    id          INTEGER PRIMARY KEY,
    delivery_id INTEGER NOT NULL REFERENCES outbox (id) ON DELETE CASCADE,
    target      TEXT NOT NULL,
    url         TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    status_code INTEGER NOT NULL DEFAULT 0,
    error       TEXT NOT NULL DEFAULT '',
    body        TEXT NOT NULL DEFAULT '',
    request_id  TEXT NOT NULL DEFAULT '',
    duration_ms REAL NOT NULL DEFAULT 0,
    at          TEXT NOT NULL,
    redirect    INTEGER NOT NULL DEFAULT 0 CHECK (redirect = 0 OR redirect = 1)
);
-- A delivery's attempts (deliveries show, the cascade from outbox).
CREATE INDEX delivery_attempts_delivery ON delivery_attempts (delivery_id);
-- Pruning by age.
CREATE INDEX delivery_attempts_at ON delivery_attempts (at);

-- What the dispatcher must remember about a target across restarts: a pause
-- (429 Retry-After) and whether it was disabled (410) until re-enabled. A
-- target without a row is neither paused nor disabled.
CREATE TABLE target_state (
    name            TEXT NOT NULL PRIMARY KEY,
    paused_until    TEXT,
    disabled        INTEGER NOT NULL DEFAULT 0 CHECK (disabled = 0 OR disabled = 1),
    disabled_reason TEXT NOT NULL DEFAULT '',
    disabled_at     TEXT
);
