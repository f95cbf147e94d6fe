-- The claim and the write that makes a job done (queries.sql, claim_jobs and
-- finish_done_many), in functions for their plans alone, as 0017 did for the hub's read. Run
-- as statements, PostgreSQL planned them afresh on almost every call: the plan it could keep
-- is costed for a LIMIT and arrays of unknown size, and a plan for the values given looks
-- cheaper; planning them (eleven indexes on jobs, the event log's partitions) took about as
-- long as running them (docs/performance.md, "The write path's kept plans"). The kept plans
-- are the ones the fresh plans were: due jobs in their index's order, each job by its key.

-- The claim: $1 how many, $2 worker id, $3 lease seconds; the jobs claimed, in claim order.
CREATE FUNCTION jobs_claim(integer, text, double precision)
RETURNS SETOF jobs
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
    WITH claimed AS (
        -- The picked ids as an array, so that the kept plan, costed for a LIMIT of unknown
        -- size, still finds each job by its key (a join to them was planned as a hash join
        -- over every job).
        UPDATE jobs j
        SET status = 'running', attempts = j.attempts + 1, worker_id = $2,
            lease_expires_at = now() + make_interval(secs => $3), started_at = now(),
            updated_at = now(), progress = NULL
        WHERE j.id = ANY (ARRAY(
            SELECT id FROM jobs
            WHERE status = 'queued' AND run_after <= now()
            ORDER BY priority DESC, run_after, id
            LIMIT $1
            FOR UPDATE SKIP LOCKED))
        RETURNING j.*
    ), ev AS (
        INSERT INTO job_events (job_id, tenant, type, payload)
        SELECT c.id, c.tenant, 'job.running', job_public(c::jobs) FROM claimed c
    )
    SELECT * FROM claimed c
    ORDER BY c.priority DESC, c.run_after, c.id;
END $$;

-- The done write: $1 ids, $2 worker, $3 attempts, $4 object keys, $5 sizes, $6 page counts,
-- $7 warnings (JSON text): parallel arrays but $2. The ids of the attempts now done.
CREATE FUNCTION jobs_finish_done(uuid[], text, int[], text[], bigint[], int[], text[])
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
    WITH input AS (
        -- warnings arrive as JSON text: a list of lists would be read as a 2-D array.
        SELECT * FROM unnest($1, $3, $4, $5, $6, $7)
            AS t(id, attempt, object_key, bytes, pages, warnings)
    ), done AS (
        UPDATE jobs j
        SET status = 'done', object_key = i.object_key, bytes = i.bytes, pages = i.pages,
            warnings = i.warnings::jsonb,
            progress = 100, error = NULL, lease_expires_at = NULL, worker_id = NULL,
            finished_at = now(), updated_at = now()
        FROM input i
        WHERE j.id = i.id AND j.status = 'running' AND j.worker_id = $2
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
END $$;
