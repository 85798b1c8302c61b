-- 0021: a running reconcile run names the process that runs it, as a job
-- run does (0019, same form: host/pid/start/space). A run left 'running'
-- by a process killed on this host stayed so for an hour after its last
-- heartbeat (ReconcileStaleAfter), shown as running on the dashboard beside
-- its job run, already closed as abandoned; the next reconcile of its
-- resource, or maintenance, now closes it at once. NULL for runs started
-- by older binaries, which keep the heartbeat's rule, as runs of other
-- hosts do.
ALTER TABLE reconcile_runs ADD COLUMN owner TEXT;
