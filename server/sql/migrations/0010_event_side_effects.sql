-- What follows an event row is written in one place: this trigger. Until now each statement
-- that changed a job's state also wrote the webhook outbox row (with its "disabled" check),
-- the NOTIFY and, through 0004's trigger, the batch events: the same SQL pasted into nine
-- statements. A statement now writes the state change and its event rows only; everything
-- else follows from the rows it inserted, in the same transaction, and an event row written
-- by any statement gets it. One function also replaces 0004/0005's batch trigger, so each
-- statement pays for one trigger call, not two (docs/performance.md, "Write path").
--
-- The rules, as the statements had them:
-- - webhook outbox: one row per job.done, job.failed or job.cancelled event of a job with a
--   webhook_url, unless a delivery of that job to that URL was disabled (410 Gone); its
--   payload is the event's (the job's public JSON at that moment); then one NOTIFY on
--   pressroom_webhooks, payload 'w'.
-- - NOTIFY on pressroom, payload '<kind>:<greatest event id of the statement>': kind 'q' when
--   some job of the statement was queued or retried and not also started in it (a hand-off
--   inserts a job running, with both events), so the workers look for work; 'e' otherwise.
-- - batch events: 0005's fast path, unchanged. Their own insert comes back here one level
--   deeper and notifies nothing: the statement that caused them does. A batch event written
--   on its own (batch_announce) notifies as any other.
-- PostgreSQL sends one notification per distinct payload per transaction, so a statement
-- sends one, and a transaction of several statements one per statement, as before.
CREATE FUNCTION job_events_after_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    last_id bigint;
    queued boolean;
    started boolean;
    batches_only boolean;
    hooks boolean;
BEGIN
    -- One look at the rows first, so a statement does only the work its events call for (an
    -- empty claim, the idle poll, none at all).
    SELECT max(a.id),
           bool_or(a.type IN ('job.queued', 'job.retrying')),
           bool_or(a.type = 'job.running'),
           bool_and(a.job_id IS NULL),
           bool_or(a.type IN ('job.done', 'job.failed', 'job.cancelled')
                   AND a.payload->>'webhook_url' IS NOT NULL)
    INTO last_id, queued, started, batches_only, hooks
    FROM added a;
    IF last_id IS NULL THEN
        RETURN NULL;
    END IF;

    IF NOT batches_only AND EXISTS (
        SELECT 1 FROM added a JOIN batch_items i ON i.job_id = a.job_id
        WHERE a.type LIKE 'job.%' AND a.type <> 'job.progress'
    ) THEN
        PERFORM batch_log_events(ARRAY(
            SELECT DISTINCT i.batch_id FROM added a JOIN batch_items i ON i.job_id = a.job_id
            WHERE a.type LIKE 'job.%' AND a.type <> 'job.progress'));
    END IF;

    IF hooks THEN
        WITH hook AS (
            INSERT INTO webhook_deliveries (job_id, tenant, url, type, payload)
            SELECT a.job_id, a.tenant, a.payload->>'webhook_url', a.type, a.payload
            FROM added a
            WHERE a.type IN ('job.done', 'job.failed', 'job.cancelled')
              AND a.payload->>'webhook_url' IS NOT NULL
              AND NOT EXISTS (
                  SELECT 1 FROM webhook_deliveries w
                  WHERE w.job_id = a.job_id AND w.url = a.payload->>'webhook_url'
                    AND w.status = 'disabled')
            RETURNING 1
        )
        SELECT count(*) > 0 INTO hooks FROM hook;
        IF hooks THEN
            PERFORM pg_notify('pressroom_webhooks', 'w');
        END IF;
    END IF;

    IF queued AND started THEN
        -- A hand-off: work for the workers only if some job was not also started.
        SELECT bool_or(j.queued AND NOT j.started) INTO queued
        FROM (SELECT bool_or(a.type IN ('job.queued', 'job.retrying')) AS queued,
                     bool_or(a.type = 'job.running') AS started
              FROM added a GROUP BY a.job_id) j;
    END IF;
    IF NOT (batches_only AND pg_trigger_depth() > 1) THEN
        PERFORM pg_notify('pressroom', CASE WHEN queued THEN 'q:' ELSE 'e:' END || last_id);
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER job_events_batch_progress ON job_events;
DROP FUNCTION batch_events_after_job_events();

CREATE TRIGGER job_events_side_effects AFTER INSERT ON job_events
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION job_events_after_insert();
