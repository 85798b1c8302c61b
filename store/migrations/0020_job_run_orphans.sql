-- 0020: a full reconcile job's run keeps the orphans it counted.
--
-- orphans: objects the mirror holds that the platform no longer lists,
-- counted at the end of a full reconcile (its reports in reconcile_runs
-- have them per resource); NULL for a run that did not count them (any
-- other job, a reconcile that is not full, or one that did not get to the
-- end). backstop run and backstop jobs showed every count of such a run
-- but this one.
ALTER TABLE job_runs ADD COLUMN orphans INTEGER;
