-- Records other components keep in the shared store under a namespace and a key (see
-- wharf's `store::Record`): the embedded authorization server's clients, codes, tokens,
-- consents and logins. Keys may be URLs (OAuth client ids); the version counts writes, for
-- compare-and-swap.
CREATE TABLE wharf_records (
    namespace  TEXT   NOT NULL,
    key        TEXT   NOT NULL,
    value      TEXT   NOT NULL,
    version    BIGINT NOT NULL,
    owner      TEXT,
    expires_at BIGINT,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;
-- A user's records of one kind (the consents they may revoke), and the sweep's expired ones.
CREATE INDEX wharf_records_owner ON wharf_records (namespace, owner) WHERE owner IS NOT NULL;
CREATE INDEX wharf_records_expiry ON wharf_records (expires_at) WHERE expires_at IS NOT NULL;
