-- 0016: a job run keeps what it made that its counts do not tell.
--
-- output: the file a backup job (kind backup) wrote; NULL for the other
-- kinds and for runs that made nothing. Shown by backstop jobs, backstop
-- run and the dashboard. Older binaries insert runs without it.
ALTER TABLE job_runs ADD COLUMN output TEXT;
