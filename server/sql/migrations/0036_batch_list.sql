-- The dashboard's batches view (GET /v1/batches): a tenant's batches newest first, by cursor,
-- read in index order from this index instead of sorting every batch of the tenant.
--
-- Safe with jobs in flight: a new index, built under this transaction's lock (the build holds
-- off new batches for its duration; batches are few next to jobs).
CREATE INDEX batches_tenant_created ON batches (tenant, created_at DESC, id DESC);
