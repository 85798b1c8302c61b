-- 0012: a job run is stored when it starts, and the store has an identity.
--
-- job_runs: a run is inserted as 'running' when it starts, with
-- heartbeat_at (its start, then beaten while it runs), and finished in
-- place. finished_at stays NOT NULL: while the run goes on it holds its
-- last heartbeat, so that a binary from before this migration still
-- running on the store (a rolling deploy) reads such a row as it reads
-- any other (it scans finished_at into a plain string). A 'running' run whose heartbeat
-- stopped long ago (its process was killed or crashed) is closed as
-- 'abandoned' by the next run of its job or by maintenance
-- (store.AbandonStaleJobRuns), as reconcile runs are since 0010. Runs
-- stored before this migration keep their statuses; their heartbeat is
-- their end.
--
-- ALTER TABLE ADD COLUMN cannot change the status CHECK constraint: the
-- table is rebuilt as in 0010 (it holds
-- the 30 days maintenance keeps) and its indexes made again.
--
-- store_meta: one row, whose store_id is a random id made once, when the
-- store is created or upgraded. It names this store in the Redis keys that
-- processes of several stores share (the jobs lease and the job locks), so
-- that stores on one API key and one Redis do not stand in each other's way.

CREATE TABLE job_runs_new (
    id           INTEGER PRIMARY KEY,
    job          TEXT NOT NULL,
    kind         TEXT NOT NULL,
    started_at   TEXT NOT NULL,
    finished_at  TEXT NOT NULL,
    status       TEXT NOT NULL
                 CHECK (status IN ('running', 'ok', 'failed', 'interrupted', 'skipped', 'abandoned')),
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
    error        TEXT,
    -- The default is for a run stored by a binary from before this
    -- migration still running on the store, which sets none: those store
    -- finished runs only.
    heartbeat_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
INSERT INTO job_runs_new (id, job, kind, started_at, finished_at, status, pages, objects, new, updated,
    missing, behind, reemitted, suppressed, pruned, requests, rate_limited, error, heartbeat_at)
SELECT id, job, kind, started_at, finished_at, status, pages, objects, new, updated,
    missing, behind, reemitted, suppressed, pruned, requests, rate_limited, error, finished_at
FROM job_runs;
DROP TABLE job_runs;
ALTER TABLE job_runs_new RENAME TO job_runs;
CREATE INDEX job_runs_job ON job_runs (job, started_at);
CREATE INDEX job_runs_started ON job_runs (started_at);
-- The runs left running, for the abandon check of every run's start.
CREATE INDEX job_runs_running ON job_runs (job) WHERE status = 'running';

CREATE TABLE store_meta (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    store_id TEXT NOT NULL
);
INSERT INTO store_meta (id, store_id) VALUES (1, lower(hex(randomblob(16))));
