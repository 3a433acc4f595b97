-- Collection names are machine keys: compare them by bytes, whatever the database's locale,
-- so the range `<handle>/` .. `<handle>0` that retiring a handle deletes is exact (a
-- linguistic collation would skip the '/' and miss or over-match rows).
ALTER TABLE wharf_rows ALTER COLUMN collection TYPE TEXT COLLATE "C";
ALTER TABLE wharf_docs ALTER COLUMN collection TYPE TEXT COLLATE "C";
ALTER TABLE wharf_collections ALTER COLUMN name TYPE TEXT COLLATE "C";
