-- Staged rows go with their import's handle through a trigger on the handle's deletion
-- instead of a foreign key. A foreign key checks every inserted row against wharf_handles
-- and locks the handle's row (FOR KEY SHARE) to do it: 50 checks and a lock written into
-- the handle's tuple for an append of 50 rows, which cost a fifth of the append's throughput
-- (BENCHMARKS.md, 2026-12-01). No append can land under a handle being deleted: appends hold
-- the handle's shared advisory lock and find it alive, deletion takes it exclusively.
ALTER TABLE ref_staged_rows DROP CONSTRAINT ref_staged_rows_import_fkey;

CREATE FUNCTION ref_drop_staged_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM ref_staged_rows WHERE import = OLD.id;
    RETURN OLD;
END
$$;

CREATE TRIGGER ref_staged_rows_go_with_their_import
    AFTER DELETE ON wharf_handles
    FOR EACH ROW EXECUTE FUNCTION ref_drop_staged_rows();
