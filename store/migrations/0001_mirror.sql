-- 0001: the mirror tables (one per resource) and the sync cursors.
--
-- Every time column holds backstop.CanonicalTime text (UTC, nanoseconds, fixed
-- width), so that text order is time order. data is the object's JSON exactly
-- as received; the typed columns are VIRTUAL generated columns read out of it,
-- so they can never disagree with data.

CREATE TABLE contacts (
    id         TEXT NOT NULL PRIMARY KEY,
    updated_at TEXT NOT NULL,
    data       TEXT NOT NULL,
    synced_at  TEXT NOT NULL,
    created_at TEXT GENERATED ALWAYS AS (json_extract(data, '$.created_at')) VIRTUAL,
    name       TEXT GENERATED ALWAYS AS (json_extract(data, '$.name')) VIRTUAL,
    email      TEXT GENERATED ALWAYS AS (json_extract(data, '$.email')) VIRTUAL,
    phone      TEXT GENERATED ALWAYS AS (json_extract(data, '$.phone')) VIRTUAL
);
CREATE INDEX contacts_updated_at_id ON contacts (updated_at, id);

CREATE TABLE chats (
    id         TEXT NOT NULL PRIMARY KEY,
    updated_at TEXT NOT NULL,
    data       TEXT NOT NULL,
    synced_at  TEXT NOT NULL,
    created_at TEXT GENERATED ALWAYS AS (json_extract(data, '$.created_at')) VIRTUAL,
    contact_id TEXT GENERATED ALWAYS AS (json_extract(data, '$.contact_id')) VIRTUAL,
    channel    TEXT GENERATED ALWAYS AS (json_extract(data, '$.channel')) VIRTUAL,
    status     TEXT GENERATED ALWAYS AS (json_extract(data, '$.status')) VIRTUAL
);
CREATE INDEX chats_updated_at_id ON chats (updated_at, id);

CREATE TABLE messages (
    id         TEXT NOT NULL PRIMARY KEY,
    updated_at TEXT NOT NULL,
    data       TEXT NOT NULL,
    synced_at  TEXT NOT NULL,
    created_at TEXT GENERATED ALWAYS AS (json_extract(data, '$.created_at')) VIRTUAL,
    chat_id    TEXT GENERATED ALWAYS AS (json_extract(data, '$.chat_id')) VIRTUAL,
    direction  TEXT GENERATED ALWAYS AS (json_extract(data, '$.direction')) VIRTUAL
);
CREATE INDEX messages_updated_at_id ON messages (updated_at, id);

CREATE TABLE payments (
    id         TEXT NOT NULL PRIMARY KEY,
    updated_at TEXT NOT NULL,
    data       TEXT NOT NULL,
    synced_at  TEXT NOT NULL,
    created_at TEXT GENERATED ALWAYS AS (json_extract(data, '$.created_at')) VIRTUAL,
    contact_id TEXT GENERATED ALWAYS AS (json_extract(data, '$.contact_id')) VIRTUAL,
    amount     INTEGER GENERATED ALWAYS AS (json_extract(data, '$.amount')) VIRTUAL,
    currency   TEXT GENERATED ALWAYS AS (json_extract(data, '$.currency')) VIRTUAL,
    status     TEXT GENERATED ALWAYS AS (json_extract(data, '$.status')) VIRTUAL
);
CREATE INDEX payments_updated_at_id ON payments (updated_at, id);

-- One row per (resource, kind): the incremental sync cursor and the backfill
-- checkpoint. (pos_updated_at, pos_id) is the feed position of the last object
-- read before value; the zero position is stored as CanonicalTime of the zero
-- time and an empty id, which sorts before every object.
CREATE TABLE cursors (
    resource       TEXT NOT NULL,
    kind           TEXT NOT NULL,
    value          TEXT NOT NULL,
    pos_updated_at TEXT NOT NULL,
    pos_id         TEXT NOT NULL,
    done           INTEGER NOT NULL DEFAULT 0 CHECK (done IN (0, 1)),
    updated_at     TEXT NOT NULL,
    PRIMARY KEY (resource, kind)
);
