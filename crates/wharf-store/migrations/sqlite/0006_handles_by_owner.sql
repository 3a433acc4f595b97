-- Counts a principal's live handles of one kind (a kind's cap per owner) without reading
-- every handle.
CREATE INDEX wharf_handles_owner_kind ON wharf_handles (owner, kind);
