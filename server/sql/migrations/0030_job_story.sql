-- A job's attempts, one row each, for its story (GET /v1/jobs/{id}/story, the dashboard's job
-- page): which worker ran it, when it started and ended, how it ended, its error and warnings.
-- The job row keeps only its last attempt's worker and start, and its events carry no worker,
-- so the row is written as an attempt ends, by a trigger on the job's move out of `running`:
-- whichever statement ends it (done, failed, retried, rescued, released at shutdown,
-- cancelled) writes it, and none of them names it. Attempts still running are the job row's.
--
-- Safe with jobs in flight: a new table and a trigger that only inserts into it; an older
-- process's statements fire it as well, so no attempt that ends after this goes unrecorded.
CREATE TABLE job_attempts (
    job_id     uuid        NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt    integer     NOT NULL,
    worker_id  text        NOT NULL,
    started_at timestamptz NOT NULL,
    ended_at   timestamptz NOT NULL DEFAULT now(),
    -- released: handed back at shutdown, not counted (the next attempt has its number again).
    outcome    text        NOT NULL,
    error      text,
    warnings   jsonb       NOT NULL DEFAULT '[]',
    CONSTRAINT job_attempts_outcome_known
        CHECK (outcome IN ('done', 'retrying', 'failed', 'cancelled', 'released'))
);
CREATE INDEX job_attempts_job ON job_attempts (job_id, ended_at);

CREATE FUNCTION jobs_record_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    outcome text := CASE
        WHEN NEW.status <> 'queued' THEN NEW.status
        WHEN NEW.attempts < OLD.attempts THEN 'released'
        ELSE 'retrying' END;
BEGIN
    INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error, warnings)
    VALUES (OLD.id, OLD.attempts, OLD.worker_id, OLD.started_at, outcome,
            CASE WHEN outcome IN ('failed', 'retrying') THEN NEW.error END,
            CASE WHEN outcome IN ('done', 'failed', 'retrying') THEN NEW.warnings
                 ELSE '[]'::jsonb END);
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_attempt_ended AFTER UPDATE OF status ON jobs
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status <> 'running')
    EXECUTE FUNCTION jobs_record_attempt();
