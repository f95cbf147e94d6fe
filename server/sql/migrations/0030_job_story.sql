-- A job's attempts, one row each, for its story (GET /v1/jobs/{id}/story, the dashboard's job
-- page): which worker ran it, when it started and ended, how it ended, its error and warnings.
-- The job row keeps only its last attempt's worker and start, and its events carry no worker,
-- so the row is written as an attempt ends, by a trigger on the job's move out of `running`:
-- whichever statement ends it (done, failed, retried, rescued, released at shutdown,
-- cancelled) writes it, and none of them names it. Attempts still running are the job row's.
--
-- It also notifies the webhook senders when a delivery is due again (redelivered by hand), and
-- shows a delivery with its tries as the story does (webhook_delivery_story).
--
-- Safe with jobs in flight: a new table, and triggers that only insert into it or notify; an
-- older process's statements fire them as well, so no attempt that ends after this goes
-- unrecorded (an older process never puts a delivery back to pending).
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

-- A delivery due again (POST /v1/jobs/{id}/webhooks/{delivery_id}/redeliver) wakes every
-- process's sender, as a new one does (job_events_after_insert); no statement notifies itself.
CREATE FUNCTION webhook_deliveries_due_again() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pressroom_webhooks', 'w');
    RETURN NULL;
END $$;

CREATE TRIGGER webhook_deliveries_requeued AFTER UPDATE OF status ON webhook_deliveries
    FOR EACH ROW
    WHEN (OLD.status <> 'pending' AND NEW.status = 'pending')
    EXECUTE FUNCTION webhook_deliveries_due_again();

-- A webhook delivery as a job's story shows it (queries.sql: job_story, redeliver_webhook): its
-- state and every try.
CREATE FUNCTION webhook_delivery_story(w webhook_deliveries) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', w.id, 'type', w.type, 'url', w.url, 'status', w.status,
        'attempts', w.attempts, 'last_status_code', w.last_status_code,
        'last_error', w.last_error,
        'next_attempt_at', CASE WHEN w.status = 'pending' THEN w.next_attempt_at END,
        'created_at', w.created_at, 'delivered_at', w.delivered_at,
        'tries', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                         'attempt', t.attempt, 'status_code', t.status_code,
                         'duration_ms', t.duration_ms, 'error', t.error, 'at', t.at)
                         ORDER BY t.attempt), '[]'::jsonb)
                  FROM webhook_attempts t WHERE t.delivery_id = w.id))
$$;
