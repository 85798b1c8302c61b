-- 0006: samples the dashboard draws over time: the rate-limit budget of each
-- API key with the requests, 429s and throttle waits since the previous
-- sample, and the intake's duplicates and signature failures since the
-- previous sample. serve writes one sample a minute and keeps 14 days.
--
-- Time columns hold backstop.CanonicalTime text, as in 0001, so text order is
-- time order. key_id is the governor's KeyID (a hash), never the key.
CREATE TABLE quota_samples (
    key_id           TEXT NOT NULL,
    at               TEXT NOT NULL,
    quota_limit      INTEGER NOT NULL,
    remaining        INTEGER NOT NULL,
    reset_at         TEXT,
    paused_until     TEXT,
    requests         INTEGER NOT NULL DEFAULT 0,
    rate_limited     INTEGER NOT NULL DEFAULT 0,
    throttle_wait_ms REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (key_id, at)
) WITHOUT ROWID;
CREATE INDEX quota_samples_at ON quota_samples (at);

CREATE TABLE intake_samples (
    at                 TEXT NOT NULL PRIMARY KEY,
    duplicates         INTEGER NOT NULL DEFAULT 0,
    signature_failures INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
