-- What made a job's PDF and what its preflight checks found, on its JSON: `provenance`
-- (Pressroom's version, the engine, the stored template, the SHA-256 of the data and of each
-- asset, the finishing steps; the same as the PDF's XMP, server/pdf/provenance.py) and
-- `preflight` (a list of {kind, page, detail}, server/render/preflight.py; NULL when the
-- checks did not run). Written by job_record_finishing, the attempt's write before its done
-- write, whose event carries them.
--
-- Safe with jobs in flight: nullable columns without a default change the catalog only, and
-- job_public is replaced in place; an older process's finishing write leaves them NULL.
ALTER TABLE jobs
    ADD COLUMN provenance jsonb,
    ADD COLUMN preflight jsonb;

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
        'preflight', j.preflight
    )
$$;
