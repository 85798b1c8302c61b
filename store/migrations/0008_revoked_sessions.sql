-- 0008: dashboard sessions ended by signing out. A session cookie is signed,
-- not stored, so signing out must remember its id: a copied cookie then
-- stops working too. A row is kept until the session would have expired
-- (expires_at, backstop.CanonicalTime text), then pruned.
CREATE TABLE revoked_sessions (
    id         TEXT NOT NULL PRIMARY KEY,
    expires_at TEXT NOT NULL
) WITHOUT ROWID;
