-- Fences of the mutation locks (session-level advisory locks, which end with their session
-- even while the call that took one still runs): whoever takes a key's lock writes a new
-- token from the sequence under it, and a transaction written under the lock checks at
-- commit, holding the row, that the token is still its own. `lock` is the advisory lock's
-- own number, hashtextextended(key, 1); `locked_at` (ms) lets the sweep forget idle keys.
CREATE SEQUENCE wharf_lock_tokens;
CREATE TABLE wharf_lock_fences (
    lock      BIGINT PRIMARY KEY,
    token     BIGINT NOT NULL,
    locked_at BIGINT NOT NULL
);
CREATE INDEX wharf_lock_fences_locked_at ON wharf_lock_fences (locked_at);
