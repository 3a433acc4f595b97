-- Wharf's own tables (SQLite). Timestamps are milliseconds since the Unix epoch in BIGINT,
-- JSON is stored as TEXT. Tables keyed by text are WITHOUT ROWID: the primary key is the
-- table's own B-tree, so a row is one insert instead of two (a rowid table plus its index).

CREATE TABLE wharf_handles (
    id           TEXT PRIMARY KEY,
    kind         TEXT NOT NULL,
    owner        TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    idle_ms      BIGINT,
    last_used_at BIGINT NOT NULL
) WITHOUT ROWID;
CREATE INDEX wharf_handles_expires_at ON wharf_handles (expires_at);

CREATE TABLE wharf_idempotency (
    scope      TEXT NOT NULL,
    key        TEXT NOT NULL,
    digest     TEXT NOT NULL,
    state      TEXT NOT NULL,
    result     TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
CREATE INDEX wharf_idempotency_expires_at ON wharf_idempotency (expires_at);

CREATE TABLE wharf_docs (
    collection TEXT NOT NULL,
    key        TEXT NOT NULL,
    doc        TEXT NOT NULL,
    PRIMARY KEY (collection, key)
) WITHOUT ROWID;

CREATE TABLE wharf_collections (
    name     TEXT PRIMARY KEY,
    next_seq BIGINT NOT NULL,
    len      BIGINT NOT NULL
) WITHOUT ROWID;

CREATE TABLE wharf_rows (
    collection TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    doc        TEXT NOT NULL,
    PRIMARY KEY (collection, seq)
) WITHOUT ROWID;
