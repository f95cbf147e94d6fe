-- A job made from a stored template (template_id) keeps that template's name and version, so
-- the dashboard's list names it (invoice@3) and filters by it (GET /v1/jobs?template=invoice,
-- or invoice@3): jobs_tenant_template holds a tenant's template jobs by name, newest first, with
-- the version and the state in the entry, so one version's page and the counts by state are read
-- from the index without visiting the rows of the other versions. Partial: jobs from inline
-- HTML, Markdown, pages and files have no entry, and their inserts pay nothing for it.
--
-- Each attempt keeps the seconds it spent in each phase its worker went through (template,
-- render, finishing, store), as the worker measured them, for the job's story. The statement
-- that ends an attempt (done, failed, retried) writes them to the job row, tagged with the
-- attempt's number, and jobs_record_attempt copies them into the attempt's row as it writes it:
-- no statement or round trip more per job. A tag of another attempt (left by an attempt whose
-- phases were never written: rescued, released, or ended by an older process) is not copied.
--
-- Safe with jobs in flight: nullable columns without a default change the catalog only (no row
-- is rewritten); the index is built under this transaction's lock (inserts wait for the build,
-- seconds on a table of a million jobs); jobs_record_attempt is replaced in place. The done
-- write takes the attempts' phases as one more argument, NULL by default, so an older process's
-- call, which names seven, runs the new function (its prepared statement is planned again) and
-- records attempts without phases, as they were before; its inserts keep no template name.
ALTER TABLE jobs
    ADD COLUMN template_name text,
    ADD COLUMN template_version integer,
    ADD COLUMN attempt_phases jsonb;
ALTER TABLE job_attempts ADD COLUMN phases jsonb;

CREATE INDEX jobs_tenant_template
    ON jobs (tenant, template_name, created_at DESC, id DESC, template_version, status)
    WHERE template_name IS NOT NULL;

CREATE OR REPLACE FUNCTION jobs_record_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    outcome text := CASE
        WHEN NEW.status <> 'queued' THEN NEW.status
        WHEN NEW.attempts < OLD.attempts THEN 'released'
        ELSE 'retrying' END;
BEGIN
    INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error, warnings,
                              phases)
    VALUES (OLD.id, OLD.attempts, OLD.worker_id, OLD.started_at, outcome,
            CASE WHEN outcome IN ('failed', 'retrying') THEN NEW.error END,
            CASE WHEN outcome IN ('done', 'failed', 'retrying') THEN NEW.warnings
                 ELSE '[]'::jsonb END,
            CASE WHEN (NEW.attempt_phases->>'attempt')::int = OLD.attempts
                 THEN NEW.attempt_phases - 'attempt' END);
    RETURN NULL;
END $$;

DROP FUNCTION jobs_finish_done(uuid[], text, int[], text[], bigint[], int[], text[]);

CREATE FUNCTION jobs_finish_done(uuid[], text, int[], text[], bigint[], int[], text[],
                                 text[] DEFAULT NULL)
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    WITH input AS (
        -- warnings and phases arrive as JSON text: a list of lists would be read as a 2-D
        -- array. Without phases (an older caller), unnest pads the column with NULLs.
        SELECT * FROM unnest($1, $3, $4, $5, $6, $7, $8)
            AS t(id, attempt, object_key, bytes, pages, warnings, phases)
    ), done AS (
        UPDATE jobs j
        SET status = 'done', object_key = i.object_key, bytes = i.bytes, pages = i.pages,
            warnings = i.warnings::jsonb, attempt_phases = i.phases::jsonb,
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
