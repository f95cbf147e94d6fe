-- GET /v1/jobs?status= lists a tenant's jobs in one state, newest first. Done jobs are most of
-- the table and the tenant's index by age finds them at once; a rarer state (failed, say)
-- was looked for by reading every job (70 ms at 200,000, growing with the jobs kept). This
-- index holds the jobs in every state but done, by tenant, state and age: the listing reads
-- just the page it returns. Done jobs leave no entry, so it stays as small as the jobs in
-- flight and the failures kept.
CREATE INDEX jobs_tenant_state_created ON jobs (tenant, status, created_at DESC, id DESC)
    WHERE status <> 'done';
