-- The write that makes jobs done (queries.sql, finish_done_many), in a function for its plan
-- alone, as 0017 did for the hub's read. Run as a statement, PostgreSQL planned it afresh on
-- every call: the plan it could keep is costed for arrays of unknown size, a plan for the
-- values given looks cheaper, and planning it (eleven indexes on jobs, the event log's
-- partitions, job_public inlined) cost more than running it (docs/performance-notes.md, "The
-- done write's kept plan").
--
-- The kept plan must find each job by its key at any size of the table. Planned on a young
-- table, a sequential scan looks cheaper and would be kept as the table grows (until an
-- ANALYZE invalidates it); with sequential scans off while it is planned, the plan takes the
-- primary key whenever it can, and `j.id = ANY ($1)` lets it do so in both halves (the check
-- for an attempt already done read every done job otherwise).
CREATE FUNCTION jobs_finish_done(uuid[], text, int[], text[], bigint[], int[], text[])
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
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
        WHERE j.id = ANY ($1) AND j.id = i.id AND j.status = 'running' AND j.worker_id = $2
          AND j.attempts = i.attempt
        RETURNING j.*
    ), ev AS (
        INSERT INTO job_events (job_id, tenant, type, payload)
        SELECT d.id, d.tenant, 'job.done', job_public(d::jobs) FROM done d
    )
    SELECT d.id FROM done d
    UNION ALL
    SELECT j.id FROM jobs j JOIN input i ON j.id = i.id
    WHERE j.id = ANY ($1) AND j.status = 'done' AND j.object_key = i.object_key;
END $$;
