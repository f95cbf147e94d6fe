-- A job's data is kept as it was submitted: json, not jsonb. jsonb orders an object's keys by
-- their length and rewrites numbers (1e+20 comes back as 100000000000000000000, -0.0 as 0.0),
-- so a template looping over an object or printing a number saw something else than was
-- sent, and a job's first attempt could differ from a later one. The hand-off also starts a
-- job's render from the submitted values while its row is being written; with json, every
-- attempt reads exactly those values back. Nothing queries inside the data, so nothing needs
-- jsonb's operators, and json is cheaper to take in and to give back (it is only checked).
ALTER TABLE jobs ALTER COLUMN data DROP DEFAULT;
ALTER TABLE jobs ALTER COLUMN data TYPE json USING data::json;
ALTER TABLE jobs ALTER COLUMN data SET DEFAULT '{}';
