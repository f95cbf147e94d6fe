-- The claim and the done write as they were before migration 0019: the claim joined its
-- picked rows (a kept plan costed for a LIMIT of unknown size hashed every job), and the done
-- write ran as a statement that PostgreSQL planned afresh on every call. bench/plans.py runs
-- them beside today's queries.sql. Copied from server/sql/queries.sql at c3a43dd; not used by
-- the server.

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
)
SELECT c.id, c.tenant, c.template, c.data, c.options, c.attempts, c.max_attempts, c.assets,
       c.source, c.secrets
FROM claimed c
ORDER BY c.priority DESC, c.run_after, c.id;

-- finish_done_many --
-- Attempts of one worker ($2) are done: $1 ids, $3 attempts, $4 object keys, $5 sizes, $6 page
-- counts, $7 warnings are parallel arrays. One statement, so one NOTIFY. Only the worker
-- holding an attempt may finish it: a cancelled or rescued job stays as it is. A job already
-- done with the attempt's own file counts as finished: a retry of this write after its first
-- try committed but its answer was lost (a failover, a cut cable) must not disown that file.
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
)
SELECT d.id FROM done d
UNION ALL
SELECT j.id FROM jobs j JOIN input i ON j.id = i.id
WHERE j.status = 'done' AND j.object_key = i.object_key;
