-- The pg_orders example's own table, next to the store's. Versions from 10000 up are the
-- app's (the store's own are below). IF NOT EXISTS: a database an earlier version of the
-- example created the table in by hand takes this migration as applied.
CREATE TABLE IF NOT EXISTS example_orders (
    id BIGSERIAL PRIMARY KEY,
    item TEXT NOT NULL,
    quantity INTEGER NOT NULL
);
