-- 0004: runs of scheduled jobs (schedules.yaml jobs:, `backstop run`).
--
-- Time columns hold backstop.CanonicalTime text, as in 0001, so text order is
-- time order. One row per run, written when the run ends, also when it
-- failed or was skipped because the job was still running.
CREATE TABLE job_runs (
    id           INTEGER PRIMARY KEY,
    job          TEXT NOT NULL,
    kind         TEXT NOT NULL,
    started_at   TEXT NOT NULL,
    finished_at  TEXT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('ok', 'failed', 'skipped')),
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
-- The last run of a job (backstop jobs) and pruning by age.
CREATE INDEX job_runs_job ON job_runs (job, started_at);
CREATE INDEX job_runs_started ON job_runs (started_at);
