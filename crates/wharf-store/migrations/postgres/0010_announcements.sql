-- What a call's transaction announces (its change notifications), written with its writes so
-- that the two commit together: the replica that committed publishes and deletes its rows at
-- once; rows still here a few seconds after they were written (their replica died right
-- after its commit, or could not publish) are published and deleted by whichever replica's
-- sweep (every 10 s, and when it starts) finds them first. `at` is when the row was written
-- (not its transaction's start).
CREATE TABLE wharf_announcements (
    id      BIGSERIAL PRIMARY KEY,
    payload TEXT NOT NULL,
    at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
