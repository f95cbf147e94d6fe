-- The done write carries what the attempt reports of its PDF: what finishing did ($9), what
-- made the PDF ($10, its provenance) and what preflight found ($11), each JSON text per
-- attempt. They were a statement of their own before it (job_record_finishing), one more
-- round trip and commit per job once every PDF had a provenance, and one the attempt could not
-- get past while the database was away: the done write waits for the database, then finds
-- whether the attempt is still the job's.
--
-- Safe with jobs in flight: one transaction drops the function and makes it again with three
-- more arguments, each with a default, so an older process's call of 7 or 8 still resolves
-- (and leaves these columns as its own statement wrote them).
DROP FUNCTION jobs_finish_done(uuid[], text, int[], text[], bigint[], int[], text[], text[]);

CREATE FUNCTION jobs_finish_done(uuid[], text, int[], text[], bigint[], int[], text[],
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
