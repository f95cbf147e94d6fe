-- A job's source may be uploaded PDFs (`pdfs`), merged in order in finishing with no browser
-- (server/pdf/finishing.py). Its `template` holds the files as JSON, [{"path", "title"}], and
-- `assets` each file under that path (its asset id when the job named it by id), so DELETE
-- /v1/assets keeps it while the job may still run.
--
-- `finishing` is what a job's finishing reports, shown as `finishing` on its JSON: the
-- document information it set ({"metadata": {"Title": …}}) and the sizes before and after
-- compress ({"compress": {"bytes_before", "bytes_after"}}); NULL when it reports nothing.
--
-- Safe with jobs in flight: older processes never insert the new source (the new CHECK reads
-- the table once, under the lock this transaction holds for that moment); a nullable column
-- without a default changes the catalog only, and job_public is replaced in place.
ALTER TABLE jobs
    ADD COLUMN finishing jsonb,
    DROP CONSTRAINT jobs_source_known,
    ADD CONSTRAINT jobs_source_known
        CHECK (source IN ('template', 'markdown', 'page_url', 'office', 'pdfs'));

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
        'finishing', j.finishing
    )
$$;
