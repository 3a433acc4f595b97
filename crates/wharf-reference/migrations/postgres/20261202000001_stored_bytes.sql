-- What each principal stores, in bytes of row JSON, for the per-user cap on stored bytes:
-- a dataset's rows (kept with the dataset), and each open import's staged rows (kept beside
-- them, going with the import's handle as its rows do). Existing data is counted as stored.
ALTER TABLE ref_datasets ADD COLUMN bytes BIGINT NOT NULL DEFAULT 0;
UPDATE ref_datasets SET bytes = (
    SELECT COALESCE(SUM(octet_length(r.doc)), 0) FROM ref_dataset_rows r
    WHERE r.owner = ref_datasets.owner AND r.dataset = ref_datasets.name
);

CREATE TABLE ref_staged_bytes (
    import TEXT PRIMARY KEY,
    owner  TEXT NOT NULL,
    bytes  BIGINT NOT NULL
);
CREATE INDEX ref_staged_bytes_owner ON ref_staged_bytes (owner);
INSERT INTO ref_staged_bytes (import, owner, bytes)
    SELECT s.import, h.owner, SUM(octet_length(s.doc))
    FROM ref_staged_rows s JOIN wharf_handles h ON h.id = s.import
    GROUP BY s.import, h.owner;

CREATE OR REPLACE FUNCTION ref_drop_staged_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM ref_staged_rows WHERE import = OLD.id;
    DELETE FROM ref_staged_bytes WHERE import = OLD.id;
    RETURN OLD;
END
$$;
