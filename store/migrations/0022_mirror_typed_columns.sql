-- 0022: the mirror's typed columns are stored, written by backstop beside
-- data, no longer VIRTUAL columns generated from it.
--
-- SQLite computes every generated column of a table on each INSERT and
-- UPDATE, VIRTUAL ones too (a json_extract call each): measured by
-- instruction counts, the four or five of a mirror write were 14% of an
-- emitted event's cost on the one writer. backstop now reads the same
-- values out of the object's JSON itself (store/typed.go, held to
-- json_extract and SQLite's column types by a test and a fuzz target) and
-- binds them in the same statement as data, so they still never disagree
-- with it: 11% fewer instructions per emitted event in all. The columns keep their
-- names, declared types and order; this fills them once, from data, with
-- what the generated columns gave.
ALTER TABLE contacts DROP COLUMN created_at;
ALTER TABLE contacts DROP COLUMN name;
ALTER TABLE contacts DROP COLUMN email;
ALTER TABLE contacts DROP COLUMN phone;
ALTER TABLE contacts ADD COLUMN created_at TEXT;
ALTER TABLE contacts ADD COLUMN name TEXT;
ALTER TABLE contacts ADD COLUMN email TEXT;
ALTER TABLE contacts ADD COLUMN phone TEXT;
UPDATE contacts SET
    created_at = json_extract(data, '$.created_at'),
    name = json_extract(data, '$.name'),
    email = json_extract(data, '$.email'),
    phone = json_extract(data, '$.phone');

ALTER TABLE chats DROP COLUMN created_at;
ALTER TABLE chats DROP COLUMN contact_id;
ALTER TABLE chats DROP COLUMN channel;
ALTER TABLE chats DROP COLUMN status;
ALTER TABLE chats ADD COLUMN created_at TEXT;
ALTER TABLE chats ADD COLUMN contact_id TEXT;
ALTER TABLE chats ADD COLUMN channel TEXT;
ALTER TABLE chats ADD COLUMN status TEXT;
UPDATE chats SET
    created_at = json_extract(data, '$.created_at'),
    contact_id = json_extract(data, '$.contact_id'),
    channel = json_extract(data, '$.channel'),
    status = json_extract(data, '$.status');

ALTER TABLE messages DROP COLUMN created_at;
ALTER TABLE messages DROP COLUMN chat_id;
ALTER TABLE messages DROP COLUMN direction;
ALTER TABLE messages ADD COLUMN created_at TEXT;
ALTER TABLE messages ADD COLUMN chat_id TEXT;
ALTER TABLE messages ADD COLUMN direction TEXT;
UPDATE messages SET
    created_at = json_extract(data, '$.created_at'),
    chat_id = json_extract(data, '$.chat_id'),
    direction = json_extract(data, '$.direction');

ALTER TABLE payments DROP COLUMN created_at;
ALTER TABLE payments DROP COLUMN contact_id;
ALTER TABLE payments DROP COLUMN amount;
ALTER TABLE payments DROP COLUMN currency;
ALTER TABLE payments DROP COLUMN status;
ALTER TABLE payments ADD COLUMN created_at TEXT;
ALTER TABLE payments ADD COLUMN contact_id TEXT;
ALTER TABLE payments ADD COLUMN amount INTEGER;
ALTER TABLE payments ADD COLUMN currency TEXT;
ALTER TABLE payments ADD COLUMN status TEXT;
UPDATE payments SET
    created_at = json_extract(data, '$.created_at'),
    contact_id = json_extract(data, '$.contact_id'),
    amount = json_extract(data, '$.amount'),
    currency = json_extract(data, '$.currency'),
    status = json_extract(data, '$.status');
