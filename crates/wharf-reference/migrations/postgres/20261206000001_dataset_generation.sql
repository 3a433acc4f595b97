-- Which making of a dataset its rows belong to: drawn at random when the dataset is created,
-- so that a cursor of a dataset deleted and made again under its name (its positions
-- starting over) is refused instead of skipping rows. Datasets made before count 0.
ALTER TABLE ref_datasets ADD COLUMN generation BIGINT NOT NULL DEFAULT 0;
