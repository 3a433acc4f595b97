-- Staged rows go with their import's handle through a trigger on the handle's deletion
-- instead of a foreign key, as on PostgreSQL (where the key's per-row check and lock cost a
-- fifth of the append's throughput). SQLite cannot drop a constraint: the table is rebuilt.
-- Writers on SQLite hold the whole database, so no append lands under a handle being deleted.
CREATE TABLE ref_staged_rows_new (
    import TEXT NOT NULL,
    seq    BIGINT NOT NULL,
    doc    TEXT NOT NULL,
    PRIMARY KEY (import, seq)
) WITHOUT ROWID;
INSERT INTO ref_staged_rows_new (import, seq, doc) SELECT import, seq, doc FROM ref_staged_rows;
DROP TABLE ref_staged_rows;
ALTER TABLE ref_staged_rows_new RENAME TO ref_staged_rows;

CREATE TRIGGER ref_staged_rows_go_with_their_import
    AFTER DELETE ON wharf_handles
    FOR EACH ROW BEGIN
        DELETE FROM ref_staged_rows WHERE import = OLD.id;
    END;
