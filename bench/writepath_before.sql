-- The write path as it was before migration 0010: each statement wrote its own event row,
-- NOTIFY and webhook outbox row. bench/writepath.py runs these against a database migrated up
-- to 0009 (the batch trigger of 0004/0005 in place), beside today's queries.sql on one
-- migrated to the end. Copied from server/sql/queries.sql at 857d284; not used by the server.

-- insert_jobs --
-- $1..$12 are parallel arrays, one element per job (many requests share one transaction).
-- $13 marks the jobs an idle worker of this process took (hand-off): they are inserted
-- running, attempt 1, held by worker $14 with a lease of $15 seconds, with their job.queued
-- and job.running events, so they skip the NOTIFY, the claim and its commit. The job JSON
-- returned is the job.queued event's, whichever way the job went.
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
), ev AS (
    -- Every job.queued event first, then the job.running ones: a handed-off job's events
    -- keep the order of its states. Its job.queued payload is the row as it was queued.
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT n.id, n.tenant, e.type,
           CASE WHEN e.type = 'job.queued' AND n.status = 'running'
                THEN job_public(n::jobs)
                     || '{"status": "queued", "attempts": 0, "started_at": null}'::jsonb
                ELSE job_public(n::jobs) END
    FROM new n
    JOIN (VALUES (1, 'job.queued'), (2, 'job.running')) AS e (step, type)
        ON e.step = 1 OR n.status = 'running'
    ORDER BY e.step
    RETURNING id, job_id, type, payload
)
SELECT n.id, q.payload AS job,
       -- Work for the workers only when some job stayed queued; otherwise only push.
       (SELECT pg_notify('pressroom',
                         CASE WHEN bool_and(handed.status = 'running') THEN 'e:' ELSE 'q:' END
                         || (SELECT max(id) FROM ev))
        FROM new handed) IS NULL AS notified
FROM new n
JOIN ev q ON q.job_id = n.id AND q.type = 'job.queued';

-- claim_jobs --
-- One statement: pick due jobs without waiting on rows others hold, mark them running,
-- count the attempt, log the event. $1 = how many, $2 = worker id, $3 = lease seconds.
WITH picked AS (
    SELECT id FROM jobs
    WHERE status = 'queued' AND run_after <= now()
    ORDER BY priority DESC, run_after, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE jobs j
    SET status = 'running', attempts = j.attempts + 1, worker_id = $2,
        lease_expires_at = now() + make_interval(secs => $3), started_at = now(),
        updated_at = now(), progress = NULL
    FROM picked WHERE j.id = picked.id
    RETURNING j.*
), ev AS (
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT c.id, c.tenant, 'job.running', job_public(c::jobs) FROM claimed c
    RETURNING id
)
SELECT c.id, c.tenant, c.template, c.data, c.options, c.attempts, c.max_attempts,
       (SELECT pg_notify('pressroom', 'e:' || max(id)) FROM ev) IS NULL AS notified
FROM claimed c
ORDER BY c.priority DESC, c.run_after, c.id;

-- finish_done_many --
-- Attempts of one worker ($2) are done: $1 ids, $3 attempts, $4 object keys, $5 sizes, $6 page
-- counts, $7 warnings are parallel arrays. One statement, one NOTIFY. Only the worker holding
-- an attempt may finish it: a cancelled or rescued job stays as it is.
WITH input AS (
    -- warnings arrive as JSON text: a list of lists would be read as a 2-D array.
    SELECT * FROM unnest($1::uuid[], $3::int[], $4::text[], $5::bigint[], $6::int[], $7::text[])
        AS t(id, attempt, object_key, bytes, pages, warnings)
), done AS (
    UPDATE jobs j
    SET status = 'done', object_key = i.object_key, bytes = i.bytes, pages = i.pages,
        warnings = i.warnings::jsonb,
        progress = 100, error = NULL, lease_expires_at = NULL, worker_id = NULL,
        finished_at = now(), updated_at = now()
    FROM input i
    WHERE j.id = i.id AND j.status = 'running' AND j.worker_id = $2::text
      AND j.attempts = i.attempt
    RETURNING j.*
), ev AS (
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT d.id, d.tenant, 'job.done', job_public(d::jobs) FROM done d
    RETURNING id
), hook AS (
    -- The webhook outbox row, written in this same statement (see 0002_webhooks.sql).
    INSERT INTO webhook_deliveries (job_id, tenant, url, type, payload)
    SELECT d.id, d.tenant, d.webhook_url, 'job.done', job_public(d::jobs)
    FROM done d
    WHERE d.webhook_url IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM webhook_deliveries w
        WHERE w.job_id = d.id AND w.url = d.webhook_url AND w.status = 'disabled')
    RETURNING id
)
SELECT d.id, (SELECT pg_notify('pressroom', 'e:' || max(id)) FROM ev) IS NULL AS notified,
       (SELECT CASE WHEN count(*) > 0 THEN pg_notify('pressroom_webhooks', 'w') END
        FROM hook) IS NULL AS hooked
FROM done d;

-- finish_failed --
-- A failed attempt: queued again after $5 seconds while attempts remain and the error is
-- transient ($6), else failed for good. The error joins the job's history.
WITH failed AS (
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
    RETURNING *
), ev AS (
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT f.id, f.tenant,
           CASE f.status WHEN 'queued' THEN 'job.retrying' ELSE 'job.failed' END,
           job_public(f::jobs)
    FROM failed f
    RETURNING id, type
), hook AS (
    -- The webhook outbox row, written in this same statement (see 0002_webhooks.sql).
    INSERT INTO webhook_deliveries (job_id, tenant, url, type, payload)
    SELECT f.id, f.tenant, f.webhook_url, 'job.failed', job_public(f::jobs)
    FROM failed f
    WHERE f.webhook_url IS NOT NULL AND f.status = 'failed' AND NOT EXISTS (
        SELECT 1 FROM webhook_deliveries w
        WHERE w.job_id = f.id AND w.url = f.webhook_url AND w.status = 'disabled')
    RETURNING id
)
SELECT f.id, f.status,
       (SELECT pg_notify('pressroom',
               CASE WHEN bool_or(type = 'job.retrying') THEN 'q:' ELSE 'e:' END || max(id))
        FROM ev) IS NULL AS notified,
       (SELECT CASE WHEN count(*) > 0 THEN pg_notify('pressroom_webhooks', 'w') END
        FROM hook) IS NULL AS hooked
FROM failed f;
