-- Handles are swept by the moment they are next due: the earlier of their lifetime's end and
-- their idle time's end. An index on that expression lets the sweep read only the handles
-- that are due (it read the whole table each time: the idle condition compares two columns,
-- which no index serves). The database keeps the index itself, so replicas that predate it
-- write handles as before. The sweep's query spells the expression the same way.
CREATE INDEX wharf_handles_sweep_at ON wharf_handles ((
    CASE WHEN idle_ms IS NULL OR idle_ms >= expires_at - last_used_at
        THEN expires_at
        ELSE last_used_at + idle_ms
    END
));
