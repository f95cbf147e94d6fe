-- A job keeps the trace context of the request that submitted it, its W3C traceparent
-- (00-<trace id>-<span id>-<flags>), so that each attempt's spans in a worker and each webhook
-- delivery continue that trace in whichever process claims them; NULL while tracing is off
-- (server/tracing.py). job_public shows its trace id (trace_id, null when none).
--
-- Safe with jobs in flight: a nullable column without a default is a change to the catalog
-- only (no row is rewritten), and job_public is replaced in place; older processes insert
-- NULL and show the new key.
ALTER TABLE jobs ADD COLUMN traceparent text;

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
        'trace_id', split_part(j.traceparent, '-', 2)
    )
$$;
