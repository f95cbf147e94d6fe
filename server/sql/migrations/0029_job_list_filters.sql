-- The dashboard's job list (GET /v1/jobs, GET /v1/jobs/counts, POST /v1/jobs/retry|cancel):
-- a search by metadata value (?q=) reads a GIN index of the metadata (jsonb_ops, the operator
-- class that answers `$.* == "value"`: any key's value), and the counts by state read an index
-- that holds the state, the channel and the time, never the rows: in state order, so the count
-- of each is a run of entries, and one channel's are found by skipping from state to state
-- (about 14 ms for 100,000 jobs, 0.1 ms for a channel's, docs/performance.md). An id prefix
-- goes through the primary key, an idempotency key through jobs_idempotency.
--
-- Safe with jobs in flight: two new indexes, built under this transaction's lock (the build
-- holds off inserts for its duration, seconds on a table of a million jobs).
CREATE INDEX jobs_metadata_values ON jobs USING gin (metadata);
CREATE INDEX jobs_tenant_tally ON jobs (tenant, status, channel, created_at);
