-- The import service's own tables (SQLite), beside the store's. Rows are JSON objects in
-- TEXT. Text-keyed tables are WITHOUT ROWID, as the store's are.

-- A principal's datasets. `next_seq` numbers rows and never goes back, so a cursor into
-- the rows stays meaningful after a replace.
CREATE TABLE ref_datasets (
    owner     TEXT NOT NULL,
    name      TEXT NOT NULL,
    columns   TEXT NOT NULL,
    row_count BIGINT NOT NULL DEFAULT 0,
    next_seq  BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, name)
) WITHOUT ROWID;

CREATE TABLE ref_dataset_rows (
    owner   TEXT NOT NULL,
    dataset TEXT NOT NULL,
    seq     BIGINT NOT NULL,
    doc     TEXT NOT NULL,
    PRIMARY KEY (owner, dataset, seq),
    FOREIGN KEY (owner, dataset) REFERENCES ref_datasets (owner, name) ON DELETE CASCADE
) WITHOUT ROWID;

-- Rows staged by an import, numbered from 0 without gaps; they go with the import's handle
-- (committed, aborted, or swept once expired).
CREATE TABLE ref_staged_rows (
    import TEXT NOT NULL REFERENCES wharf_handles (id) ON DELETE CASCADE,
    seq    BIGINT NOT NULL,
    doc    TEXT NOT NULL,
    PRIMARY KEY (import, seq)
) WITHOUT ROWID;

-- The latest report of each dataset; `cancelled` is set by the cleanup of run `run` only.
CREATE TABLE ref_reports (
    owner     TEXT NOT NULL,
    dataset   TEXT NOT NULL,
    run       BIGINT NOT NULL,
    doc       TEXT NOT NULL,
    cancelled BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, dataset)
) WITHOUT ROWID;
