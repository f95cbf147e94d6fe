-- The done write's kept plan finds each job by its primary key alone. 0019 turned sequential
-- scans off while it is planned, but since 0029 an index leads with the state
-- (jobs_tenant_tally): a plan kept from a young table scanned that index for every done job
-- (the check for an attempt already done), and the running jobs' partial index for the update,
-- and kept doing so as the table grew, until an ANALYZE invalidated it. At 20,000 done jobs a
-- done write of three jobs read 20,018 rows. The state is now compared with IS NOT DISTINCT
-- FROM (the same test, `status` being NOT NULL), which no index answers, so the primary key is
-- the only way to the rows whatever the statistics were when the plan was made.
--
-- Safe with jobs in flight: the function keeps its arguments and what it does.
CREATE OR REPLACE FUNCTION jobs_finish_done(uuid[], text, int[], text[], bigint[], int[], text[],
                                            text[] DEFAULT NULL, text[] DEFAULT NULL,
                                            text[] DEFAULT NULL, text[] DEFAULT NULL)
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    WITH input AS (
        -- warnings, phases and the reports arrive as JSON text: a list of lists would be read
        -- as a 2-D array. Left out (an older caller), unnest pads their columns with NULLs.
        SELECT * FROM unnest($1, $3, $4, $5, $6, $7, $8, $9, $10, $11)
            AS t(id, attempt, object_key, bytes, pages, warnings, phases, finishing,
                 provenance, preflight)
    ), done AS (
        UPDATE jobs j
        SET status = 'done', object_key = i.object_key, bytes = i.bytes, pages = i.pages,
            warnings = i.warnings::jsonb, attempt_phases = i.phases::jsonb,
            finishing = coalesce(i.finishing::jsonb, j.finishing),
            provenance = coalesce(i.provenance::jsonb, j.provenance),
            preflight = coalesce(i.preflight::jsonb, j.preflight),
            progress = 100, error = NULL, lease_expires_at = NULL, worker_id = NULL,
            finished_at = now(), updated_at = now()
        FROM input i
        WHERE j.id = ANY ($1) AND j.id = i.id AND j.status IS NOT DISTINCT FROM 'running'
          AND j.worker_id = $2 AND j.attempts = i.attempt
        RETURNING j.*
    ), ev AS (
        INSERT INTO job_events (job_id, tenant, type, payload)
        SELECT d.id, d.tenant, 'job.done', job_public(d::jobs) FROM done d
    )
    SELECT d.id FROM done d
    UNION ALL
    SELECT j.id FROM jobs j JOIN input i ON j.id = i.id
    WHERE j.id = ANY ($1) AND j.status IS NOT DISTINCT FROM 'done'
      AND j.object_key = i.object_key;
END $$;
