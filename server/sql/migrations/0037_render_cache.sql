-- The render cache (docs/documents.md, "Render cache"): a job that asked for it (`cache: true`)
-- keeps `cache_key`, the SHA-256 of what makes its PDF (its source, data, options with their
-- secrets, assets and Pressroom's version: server/web/submission.py); a later job of the same
-- tenant with the same key is inserted done, pointing at the file of a done one, and names the
-- job that rendered that file in `cached_from` (on its JSON). Retention keeps a file while a
-- job it does not delete points at it (expired_jobs); jobs_cached_from finds those jobs.
--
-- Safe with jobs in flight: nullable columns without a default change the catalog only, the
-- indexes cover the jobs that asked for the cache alone (none yet), and job_public is replaced
-- in place; an older process inserts its jobs without a key, so it neither reads nor feeds the
-- cache.
ALTER TABLE jobs
    ADD COLUMN cache_key text,
    ADD COLUMN cached_from uuid;

CREATE INDEX jobs_tenant_cache ON jobs (tenant, cache_key)
    WHERE status = 'done' AND cache_key IS NOT NULL;
CREATE INDEX jobs_cached_from ON jobs (cached_from) WHERE cached_from IS NOT NULL;

CREATE OR REPLACE FUNCTION job_public(j jobs) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', j.id,
        'status', j.status,
        'attempts', j.attempts,
        'max_attempts', j.max_attempts,
        'priority', j.priority,
        'progress', j.progress,
        'error', j.error,
        'errors', j.errors,
        'warnings', j.warnings,
        'options', j.options,
        'metadata', j.metadata,
        'webhook_url', j.webhook_url,
        'channel', j.channel,
        'pages', j.pages,
        'bytes', j.bytes,
        'run_after', j.run_after,
        'created_at', j.created_at,
        'updated_at', j.updated_at,
        'started_at', j.started_at,
        'finished_at', j.finished_at,
        'trace_id', split_part(j.traceparent, '-', 2),
        'finishing', j.finishing,
        'provenance', j.provenance,
        'preflight', j.preflight,
        'cached_from', j.cached_from
    )
$$;
