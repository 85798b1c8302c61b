-- 0003: reconciliation runs and the scratch table that finds orphans.
--
-- Time columns hold backstop.CanonicalTime text, as in 0001, so text order is
-- time order.

-- One row per reconcile run of one resource, written when the run starts
-- (status 'running') and completed when it ends, also when it fails.
-- window_since is NULL for a run from the start of the feed.
CREATE TABLE reconcile_runs (
    id           INTEGER PRIMARY KEY,
    resource     TEXT NOT NULL,
    started_at   TEXT NOT NULL,
    finished_at  TEXT,
    window_since TEXT,
    full         INTEGER NOT NULL DEFAULT 0 CHECK (full IN (0, 1)),
    dry_run      INTEGER NOT NULL DEFAULT 0 CHECK (dry_run IN (0, 1)),
    pages        INTEGER NOT NULL DEFAULT 0,
    scanned      INTEGER NOT NULL DEFAULT 0,
    missing      INTEGER NOT NULL DEFAULT 0,
    behind       INTEGER NOT NULL DEFAULT 0,
    reemitted    INTEGER NOT NULL DEFAULT 0,
    suppressed   INTEGER NOT NULL DEFAULT 0,
    orphans      INTEGER NOT NULL DEFAULT 0,
    requests     INTEGER NOT NULL DEFAULT 0,
    rate_limited INTEGER NOT NULL DEFAULT 0,
    duration_ms  INTEGER NOT NULL DEFAULT 0,
    status       TEXT NOT NULL DEFAULT 'running'
                 CHECK (status = 'running' OR status = 'ok' OR status = 'failed'),
    error        TEXT
);
-- The default window: the last successful non-dry run of a resource.
CREATE INDEX reconcile_runs_last_ok ON reconcile_runs (resource, status, dry_run, started_at);

-- The ids a --full run has seen upstream, filled page by page and
-- anti-joined against the mirror at the end, so that the set of ids never
-- has to be held in memory. Rows are deleted when the run ends.
CREATE TABLE reconcile_seen (
    run_id INTEGER NOT NULL REFERENCES reconcile_runs (id) ON DELETE CASCADE,
    id     TEXT NOT NULL,
    PRIMARY KEY (run_id, id)
) WITHOUT ROWID;
