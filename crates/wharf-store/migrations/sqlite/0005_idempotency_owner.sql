-- Whose write an idempotency record holds: a retry after the write retired its handle
-- (a commit, an abort) replays the first result to that principal alone.
ALTER TABLE wharf_idempotency ADD COLUMN owner TEXT;
