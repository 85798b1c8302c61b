-- 0015: a backup says when it was taken.
--
-- backup_info: empty in a store in use. The copy backstop backup writes
-- holds one row: taken_at, the moment the copy's read transaction saw the
-- store at the latest (the copy holds everything committed before it),
-- and source, the store's path. backstop restore shows it, to run
-- reconcile --since from, and empties it in the store it puts in place.
CREATE TABLE backup_info (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    taken_at TEXT NOT NULL,
    source   TEXT NOT NULL
);
