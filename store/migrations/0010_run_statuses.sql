-- 0010: runs that were stopped are told apart from runs that failed.
--
-- job_runs: status 'interrupted' for a run cancelled before it finished
-- (Ctrl-C or SIGTERM of `backstop run`, serve shutting down, the jobs lease
-- or the job's lock lost), as `backstop sync`, `backfill` and `reconcile`
-- report it.
--
-- reconcile_runs: status 'interrupted' likewise, and 'abandoned' for a run
-- left 'running' by a process that died without finishing it (SIGKILL, a
-- crash, a power loss); heartbeat_at is when the run last reported
-- progress (its start, then every page), so that a 'running' row whose
-- heartbeat stopped long ago can be told from one still going in another
-- process (store.AbandonStaleReconciles).
--
-- SQLite cannot change a CHECK constraint in place: each table is rebuilt
-- (create, copy, drop, rename) and its indexes made again. Dropping
-- reconcile_runs deletes the scratch rows of reconcile_seen (ON DELETE
-- CASCADE), which only a run in progress needs.

CREATE TABLE job_runs_new (
    id           INTEGER PRIMARY KEY,
    job          TEXT NOT NULL,
    kind         TEXT NOT NULL,
    started_at   TEXT NOT NULL,
    finished_at  TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('ok', 'failed', 'interrupted', 'skipped')),
    pages        INTEGER NOT NULL DEFAULT 0,
    objects      INTEGER NOT NULL DEFAULT 0,
    new          INTEGER NOT NULL DEFAULT 0,
    updated      INTEGER NOT NULL DEFAULT 0,
    missing      INTEGER NOT NULL DEFAULT 0,
    behind       INTEGER NOT NULL DEFAULT 0,
    reemitted    INTEGER NOT NULL DEFAULT 0,
    suppressed   INTEGER NOT NULL DEFAULT 0,
    pruned       INTEGER NOT NULL DEFAULT 0,
    requests     INTEGER NOT NULL DEFAULT 0,
    rate_limited INTEGER NOT NULL DEFAULT 0,
    error        TEXT
);
INSERT INTO job_runs_new (id, job, kind, started_at, finished_at, status, pages, objects, new, updated,
    missing, behind, reemitted, suppressed, pruned, requests, rate_limited, error)
SELECT id, job, kind, started_at, finished_at, status, pages, objects, new, updated,
    missing, behind, reemitted, suppressed, pruned, requests, rate_limited, error
FROM job_runs;
DROP TABLE job_runs;
ALTER TABLE job_runs_new RENAME TO job_runs;
CREATE INDEX job_runs_job ON job_runs (job, started_at);
CREATE INDEX job_runs_started ON job_runs (started_at);

CREATE TABLE reconcile_runs_new (
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
                 CHECK (status IN ('running', 'ok', 'failed', 'interrupted', 'abandoned')),
    error        TEXT,
    -- The default is for a run started by a binary from before this
    -- migration on the same store (a rolling upgrade), which sets none: its
    -- start counts as its heartbeat.
    heartbeat_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
INSERT INTO reconcile_runs_new (id, resource, started_at, finished_at, window_since, full, dry_run, pages,
    scanned, missing, behind, reemitted, suppressed, orphans, requests, rate_limited, duration_ms, status,
    error, heartbeat_at)
SELECT id, resource, started_at, finished_at, window_since, full, dry_run, pages,
    scanned, missing, behind, reemitted, suppressed, orphans, requests, rate_limited, duration_ms, status,
    error, coalesce(finished_at, started_at)
FROM reconcile_runs;
DROP TABLE reconcile_runs;
ALTER TABLE reconcile_runs_new RENAME TO reconcile_runs;
-- The default window: the last successful non-dry run of a resource.
CREATE INDEX reconcile_runs_last_ok ON reconcile_runs (resource, status, dry_run, started_at);
