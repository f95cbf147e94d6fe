-- Every statement Pressroom runs, as named blocks read by server/sql/__init__.py.
-- A state change, its event row and its NOTIFY are one statement, so one round trip and
-- one implicit transaction. The NOTIFY payload is only a hint: "<kind>:<last event id>",
-- kind "q" when the change made work due for the workers, "e" otherwise.

-- insert_jobs --
-- $1..$10 are parallel arrays, one element per job (many requests share one transaction).
WITH new AS (
    INSERT INTO jobs (id, tenant, template, data, options, metadata, webhook_url, priority,
                      max_attempts, run_after, idempotency_key, request_hash)
    SELECT id, tenant, template, data, options, metadata, webhook_url, priority,
           max_attempts, coalesce(run_after, now()), idempotency_key, request_hash
    FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::jsonb[], $6::jsonb[],
                $7::text[], $8::int[], $9::int[], $10::timestamptz[], $11::text[], $12::text[])
         AS t(id, tenant, template, data, options, metadata, webhook_url, priority,
              max_attempts, run_after, idempotency_key, request_hash)
    RETURNING *
), ev AS (
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT n.id, n.tenant, 'job.queued', job_public(n::jobs) FROM new n
    RETURNING id
)
SELECT n.id, job_public(n::jobs) AS job,
       (SELECT pg_notify('pressroom', 'q:' || max(id)) FROM ev) IS NULL AS notified
FROM new n;

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

-- finish_done --
-- Only the worker holding this attempt may finish it: a cancelled or rescued job stays as is.
WITH done AS (
    UPDATE jobs
    SET status = 'done', object_key = $4::text, bytes = $5::bigint, pages = $6::int,
        warnings = $7::jsonb,
        progress = 100, error = NULL, lease_expires_at = NULL, worker_id = NULL,
        finished_at = now(), updated_at = now()
    WHERE id = $1 AND status = 'running' AND worker_id = $2 AND attempts = $3
    RETURNING *
), ev AS (
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT d.id, d.tenant, 'job.done', job_public(d::jobs) FROM done d
    RETURNING id
)
SELECT d.id, (SELECT pg_notify('pressroom', 'e:' || max(id)) FROM ev) IS NULL AS notified
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
)
SELECT f.id, f.status,
       (SELECT pg_notify('pressroom',
               CASE WHEN bool_or(type = 'job.retrying') THEN 'q:' ELSE 'e:' END || max(id))
        FROM ev) IS NULL AS notified
FROM failed f;

-- heartbeat --
-- Extend the lease of every job this worker still holds; the ids it no longer holds
-- (cancelled, rescued) are missing from the result and their renders are aborted.
UPDATE jobs SET lease_expires_at = now() + make_interval(secs => $3)
WHERE id = ANY($1::uuid[]) AND status = 'running' AND worker_id = $2
RETURNING id;

-- rescue_expired --
-- Jobs whose worker stopped renewing the lease: queued again, or failed when out of attempts.
WITH lost AS (
    SELECT id FROM jobs
    WHERE status = 'running' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), rescued AS (
    UPDATE jobs j
    SET status = CASE WHEN j.attempts < j.max_attempts THEN 'queued' ELSE 'failed' END,
        finished_at = CASE WHEN j.attempts < j.max_attempts THEN NULL ELSE now() END,
        run_after = now(),
        error = 'worker lost: lease expired during attempt ' || j.attempts,
        errors = j.errors || jsonb_build_array(jsonb_build_object(
            'attempt', j.attempts,
            'error', 'worker lost: lease expired during attempt ' || j.attempts,
            'at', now())),
        lease_expires_at = NULL, worker_id = NULL, progress = NULL, updated_at = now()
    FROM lost WHERE j.id = lost.id
    RETURNING j.*
), ev AS (
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT r.id, r.tenant,
           CASE r.status WHEN 'queued' THEN 'job.retrying' ELSE 'job.failed' END,
           job_public(r::jobs)
    FROM rescued r
    RETURNING id
)
SELECT r.id, r.status, (SELECT pg_notify('pressroom', 'q:' || max(id)) FROM ev) IS NULL
FROM rescued r;

-- release_jobs --
-- Graceful shutdown: give unfinished jobs back at once, without charging the attempt.
WITH released AS (
    UPDATE jobs
    SET status = 'queued', attempts = attempts - 1, run_after = now(),
        lease_expires_at = NULL, worker_id = NULL, progress = NULL, updated_at = now()
    WHERE id = ANY($1::uuid[]) AND status = 'running' AND worker_id = $2
    RETURNING *
), ev AS (
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT r.id, r.tenant, 'job.retrying', job_public(r::jobs) FROM released r
    RETURNING id
)
SELECT r.id, (SELECT pg_notify('pressroom', 'q:' || max(id)) FROM ev) IS NULL
FROM released r;

-- cancel_job --
WITH cancelled AS (
    UPDATE jobs
    SET status = 'cancelled', lease_expires_at = NULL, worker_id = NULL,
        finished_at = now(), updated_at = now()
    WHERE id = $1 AND tenant = $2 AND status IN ('queued', 'running')
    RETURNING *
), ev AS (
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT c.id, c.tenant, 'job.cancelled', job_public(c::jobs) FROM cancelled c
    RETURNING id
)
SELECT job_public(c::jobs) AS job,
       (SELECT pg_notify('pressroom', 'e:' || max(id)) FROM ev) IS NULL AS notified
FROM cancelled c;

-- retry_job --
-- A failed job goes back to the queue with fresh attempts.
WITH requeued AS (
    UPDATE jobs
    SET status = 'queued', attempts = 0, run_after = now(), finished_at = NULL,
        progress = NULL, updated_at = now()
    WHERE id = $1 AND tenant = $2 AND status = 'failed'
    RETURNING *
), ev AS (
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT r.id, r.tenant, 'job.queued', job_public(r::jobs) FROM requeued r
    RETURNING id
)
SELECT job_public(r::jobs) AS job,
       (SELECT pg_notify('pressroom', 'q:' || max(id)) FROM ev) IS NULL AS notified
FROM requeued r;

-- get_job --
SELECT job_public(j) AS job, j.status, j.object_key, j.tenant
FROM jobs j WHERE j.id = $1 AND j.tenant = $2;

-- list_jobs --
-- Newest first; the cursor is the (created_at, id) of the last row of the previous page.
SELECT job_public(j) AS job, j.created_at, j.id, j.object_key
FROM jobs j
WHERE j.tenant = $1
  AND ($2::text IS NULL OR j.status = $2)
  AND ($3::timestamptz IS NULL OR j.created_at >= $3)
  AND ($4::timestamptz IS NULL OR j.created_at < $4)
  AND ($5::timestamptz IS NULL OR (j.created_at, j.id) < ($5, $6::uuid))
ORDER BY j.created_at DESC, j.id DESC
LIMIT $7;

-- next_due_at --
-- When the earliest queued job becomes due, so an idle worker sleeps exactly until then.
SELECT min(run_after) FROM jobs WHERE status = 'queued';

-- events_head --
-- The newest position that can no longer change: where a live reader starts.
SELECT xid::text::bigint AS xid, id FROM job_events
WHERE xid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY xid DESC, id DESC
LIMIT 1;

-- events_after --
-- The final part of the log after a position, in log order, for every tenant (the hub) or
-- one tenant ($4) and optionally one job ($5). `held` says whether committed events wait
-- behind a transaction still running, so the reader should look again soon. Always at
-- least one row: with no events, the event columns are NULL.
WITH horizon AS (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin),
     held AS (SELECT EXISTS (SELECT 1 FROM job_events h, horizon WHERE h.xid >= horizon.xmin)
                     AS held)
SELECT e.id, e.xid, e.job_id, e.tenant, e.type, e.payload, e.created_at, held.held
FROM held LEFT JOIN LATERAL (
    SELECT e.id, e.xid::text::bigint AS xid, e.job_id, e.tenant, e.type, e.payload,
           e.created_at
    FROM job_events e, horizon
    WHERE (e.xid, e.id) > ($1::text::xid8, $2::bigint)
      AND e.xid < horizon.xmin
      AND ($4::text IS NULL OR e.tenant = $4)
      AND ($5::uuid IS NULL OR e.job_id = $5)
    ORDER BY e.xid, e.id
    LIMIT $3
) e ON true
ORDER BY e.xid, e.id;

-- event_position --
-- Where a client's Last-Event-ID stands in the log (none when pruned or unknown).
SELECT xid::text::bigint AS xid, id, job_id, tenant FROM job_events WHERE id = $1;

-- events_oldest_id --
SELECT min(id) FROM job_events;

-- prune_events --
DELETE FROM job_events
WHERE id IN (SELECT id FROM job_events WHERE created_at < now() - make_interval(secs => $1)
             LIMIT 10000);
