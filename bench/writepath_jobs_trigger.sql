-- The alternative bench/writepath.py measures beside 0010: triggers on the jobs table write
-- the event rows themselves, so a statement writes only the change (and 0010's trigger on
-- job_events still writes what follows each event). Applied on top of every migration;
-- not used by the server.

-- setup --
-- Statement triggers with transition tables: one event insert (so one NOTIFY) per statement.
-- PostgreSQL allows no column list with transition tables, so the update trigger runs on
-- every UPDATE of jobs (a heartbeat too) and compares each row's state before and after.
CREATE FUNCTION jobs_log_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT n.id, n.tenant, e.type,
           CASE WHEN e.type = 'job.queued' AND n.status = 'running'
                THEN job_public(n::jobs)
                     || '{"status": "queued", "attempts": 0, "started_at": null}'::jsonb
                ELSE job_public(n::jobs) END
    FROM fresh n
    JOIN (VALUES (1, 'job.queued'), (2, 'job.running')) AS e (step, type)
        ON e.step = 1 OR n.status = 'running'
    ORDER BY e.step;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_log_insert AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS fresh
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_log_inserted();

CREATE FUNCTION jobs_log_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT n.id, n.tenant,
           CASE WHEN n.status = 'queued' AND o.status = 'running' THEN 'job.retrying'
                ELSE 'job.' || n.status END,
           job_public(n::jobs)
    FROM after_rows n JOIN before_rows o ON o.id = n.id
    WHERE n.status <> o.status;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_log_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows
    FOR EACH STATEMENT EXECUTE FUNCTION jobs_log_changed();

-- insert_jobs --
WITH new AS (
    INSERT INTO jobs (id, tenant, template, data, options, metadata, webhook_url, priority,
                      max_attempts, run_after, idempotency_key, request_hash,
                      status, attempts, worker_id, lease_expires_at, started_at)
    SELECT id, tenant, template, data, options, metadata, webhook_url, priority,
           max_attempts, coalesce(run_after, now()), idempotency_key, request_hash,
           CASE WHEN handed THEN 'running' ELSE 'queued' END,
           CASE WHEN handed THEN 1 ELSE 0 END,
           CASE WHEN handed THEN $14 END,
           CASE WHEN handed THEN now() + make_interval(secs => $15) END,
           CASE WHEN handed THEN now() END
    FROM unnest($1::uuid[], $2::text[], $3::text[], $4::json[], $5::jsonb[], $6::jsonb[],
                $7::text[], $8::int[], $9::int[], $10::timestamptz[], $11::text[], $12::text[],
                $13::bool[])
         AS t(id, tenant, template, data, options, metadata, webhook_url, priority,
              max_attempts, run_after, idempotency_key, request_hash, handed)
    RETURNING *
)
-- The job.queued payload is written twice here: in the trigger and for the answer.
SELECT n.id,
       CASE WHEN n.status = 'running'
            THEN job_public(n::jobs)
                 || '{"status": "queued", "attempts": 0, "started_at": null}'::jsonb
            ELSE job_public(n::jobs) END AS job
FROM new n;

-- claim_jobs --
WITH picked AS (
    SELECT id FROM jobs
    WHERE status = 'queued' AND run_after <= now()
    ORDER BY priority DESC, run_after, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs j
SET status = 'running', attempts = j.attempts + 1, worker_id = $2,
    lease_expires_at = now() + make_interval(secs => $3), started_at = now(),
    updated_at = now(), progress = NULL
FROM picked WHERE j.id = picked.id
RETURNING j.id, j.tenant, j.template, j.data, j.options, j.attempts, j.max_attempts;

-- finish_done_many --
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $3::int[], $4::text[], $5::bigint[], $6::int[], $7::text[])
        AS t(id, attempt, object_key, bytes, pages, warnings)
)
UPDATE jobs j
SET status = 'done', object_key = i.object_key, bytes = i.bytes, pages = i.pages,
    warnings = i.warnings::jsonb,
    progress = 100, error = NULL, lease_expires_at = NULL, worker_id = NULL,
    finished_at = now(), updated_at = now()
FROM input i
WHERE j.id = i.id AND j.status = 'running' AND j.worker_id = $2::text
  AND j.attempts = i.attempt
RETURNING j.id;

-- finish_failed --
UPDATE jobs
SET status = CASE WHEN $6::boolean AND attempts < max_attempts THEN 'queued' ELSE 'failed' END,
    run_after = CASE WHEN $6::boolean AND attempts < max_attempts
                     THEN now() + make_interval(secs => $5::float8) ELSE run_after END,
    finished_at = CASE WHEN $6::boolean AND attempts < max_attempts THEN NULL ELSE now() END,
    error = $4::text,
    errors = errors || jsonb_build_array(jsonb_build_object(
        'attempt', attempts, 'error', $4::text, 'at', now())),
    warnings = $7::jsonb,
    lease_expires_at = NULL, worker_id = NULL, progress = NULL, updated_at = now()
WHERE id = $1 AND status = 'running' AND worker_id = $2 AND attempts = $3
RETURNING id, status;
