-- The insert of jobs (queries.sql, insert_jobs) in a function for its plan alone, as the done
-- write (0019). As a statement, PostgreSQL planned it afresh on every call: a plan for the
-- arrays' actual lengths always looks cheaper than the one it could keep, and planning it (the
-- unnest of twenty arrays, job_public inlined, the event log's partitions) took about 0.4 ms of
-- the database's CPU per call, more than running it: every submission paid it, one at a time.
-- It reads no table but through render_cache_hit, whose lookup keeps planning as before (its own
-- plan_cache_mode), so no plan kept here can turn into a scan as the tables grow.
--
-- Safe with jobs in flight: a new function, and an older process's statement still works.
CREATE FUNCTION jobs_insert(uuid[], text[], text[], json[], jsonb[], jsonb[], text[], int[],
                            int[], timestamptz[], text[], text[], jsonb[], text[], bytea[],
                            text[], text[], text[], int[], text[])
RETURNS TABLE (inserted_id uuid, inserted_job jsonb)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH new AS (
        INSERT INTO jobs (id, tenant, template, data, options, metadata, webhook_url, priority,
                          max_attempts, run_after, idempotency_key, request_hash, channel,
                          assets, source, secrets, traceparent, template_name,
                          template_version, cache_key, cached_from, status, object_key, bytes,
                          pages, provenance, finishing, progress, finished_at)
        SELECT t.id, t.tenant, t.template, t.data, t.options, t.metadata, t.webhook_url,
               t.priority, t.max_attempts, coalesce(t.run_after, now()), t.idempotency_key,
               t.request_hash, t.channel, t.assets, t.source,
               CASE WHEN h.cached_from IS NULL THEN t.secrets END, t.traceparent,
               t.template_name, t.template_version, t.cache_key, h.cached_from,
               coalesce(h.status, 'queued'), h.object_key, h.bytes, h.pages, h.provenance,
               h.finishing, h.progress, h.finished_at
        FROM unnest($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
                    $18, $19, $20)
             AS t(id, tenant, template, data, options, metadata, webhook_url, priority,
                  max_attempts, run_after, idempotency_key, request_hash, assets, source,
                  secrets, channel, traceparent, template_name, template_version, cache_key)
        LEFT JOIN LATERAL render_cache_hit(t.tenant, t.cache_key) h ON true
        RETURNING *
    ), ev AS (
        INSERT INTO job_events (job_id, tenant, type, payload)
        SELECT n.id, n.tenant, CASE WHEN n.status = 'done' THEN 'job.done' ELSE 'job.queued' END,
               job_public(n::jobs)
        FROM new n
        RETURNING job_events.job_id, job_events.payload
    )
    SELECT ev.job_id, ev.payload FROM ev;
END $$;

ALTER FUNCTION render_cache_hit(text, text) SET plan_cache_mode = auto;
