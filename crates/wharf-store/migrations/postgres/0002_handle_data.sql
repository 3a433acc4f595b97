-- A handle may carry a small JSON document (what it names), read with the ownership check.
ALTER TABLE wharf_handles ADD COLUMN data TEXT;
