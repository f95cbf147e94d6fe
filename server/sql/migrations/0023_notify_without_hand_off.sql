-- A statement's NOTIFY says 'q' (look for work) when one of its jobs was queued or retried.
-- Jobs were once inserted already running by the submission that rendered them itself (the
-- hand-off, removed: docs/decisions/001); such a job had its job.queued and job.running in one
-- statement, and the trigger looked at each job of the statement to leave it out. No statement
-- writes both any more, so that second look goes.
--
-- Safe with jobs in flight: CREATE OR REPLACE in this migration's one transaction; a
-- statement sees the old trigger function or the new one, and they notify alike.
CREATE OR REPLACE FUNCTION job_events_after_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    last_id bigint;
    queued boolean;
    batches_only boolean;
    hooks boolean;
BEGIN
    SELECT max(a.id),
           bool_or(a.type IN ('job.queued', 'job.retrying')),
           bool_and(a.job_id IS NULL),
           bool_or(event_is_delivered(a.type, a.payload))
    INTO last_id, queued, batches_only, hooks
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
        WITH subject AS (
            SELECT a.*, CASE WHEN a.job_id IS NULL THEN (a.payload->>'id')::uuid END AS batch_id
            FROM added a
            WHERE event_is_delivered(a.type, a.payload)
        ), hook AS (
            INSERT INTO webhook_deliveries (job_id, batch_id, tenant, url, type, payload)
            SELECT s.job_id, s.batch_id, s.tenant, s.payload->>'webhook_url', s.type, s.payload
            FROM subject s
            WHERE NOT EXISTS (
                  SELECT 1 FROM webhook_deliveries w
                  WHERE (w.job_id = s.job_id OR w.batch_id = s.batch_id)
                    AND w.url = s.payload->>'webhook_url' AND w.status = 'disabled')
            RETURNING 1
        )
        SELECT count(*) > 0 INTO hooks FROM hook;
        IF hooks THEN
            PERFORM pg_notify('pressroom_webhooks', 'w');
        END IF;
    END IF;

    IF NOT (batches_only AND pg_trigger_depth() > 1) THEN
        PERFORM pg_notify('pressroom', CASE WHEN queued THEN 'q:' ELSE 'e:' END || last_id);
    END IF;
    RETURN NULL;
END $$;
