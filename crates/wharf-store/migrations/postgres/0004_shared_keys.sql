-- The secrets replicas share to sign cursors and seal request states (see wharf's `keys`):
-- one per rotation period, kept until what it signed has expired.
CREATE TABLE wharf_keys (
    id          TEXT PRIMARY KEY,
    secret      BYTEA NOT NULL,
    active_from BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);
