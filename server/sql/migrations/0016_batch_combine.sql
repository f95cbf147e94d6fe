-- One PDF for a batch (`combine`): once every item is done, the items' PDFs are joined in
-- item order into one file, stored like a job's. A batch that asks has one row here, whose
-- state is:
--
--   waiting       some item is not final yet                       (shown as pending)
--   items_failed  every item is final, some failed or were cancelled (shown as failed)
--   pending       every item is done: due to be joined
--   running       a process holds it under a lease while it joins
--   done          the file is stored (object_key, pages, bytes)
--   failed        the join failed for good (error)
--
-- The items move it between waiting, items_failed and pending: batch_log_events does it under
-- the batch's lock, in the transaction of the job change, before it logs the batch's event, so
-- the event already shows where the join stands. A process claims a pending row (FOR UPDATE
-- SKIP LOCKED), joins off its event loop, stores the file and marks it done; a failure that
-- may pass puts it back to pending after a backoff, a lease that runs out (the process died)
-- is rescued. Each of those moves logs the batch's event through a trigger on this table, in
-- the statement's transaction.
--
-- The batch is done only once its join is over (done, failed or items_failed): batch.done is
-- logged after the file is stored and carries it. Retrying a failed item takes the row from
-- items_failed back to waiting, and the batch's completion joins again.

CREATE TABLE batch_combines (
    batch_id         uuid        PRIMARY KEY REFERENCES batches (id) ON DELETE CASCADE,
    tenant           text        NOT NULL,
    -- One outline entry per item, titled with its key.
    outline          boolean     NOT NULL,
    status           text        NOT NULL DEFAULT 'waiting',
    attempts         integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL,
    run_after        timestamptz NOT NULL DEFAULT now(),
    worker_id        text,
    lease_expires_at timestamptz,
    error            text,
    object_key       text,
    pages            integer,
    bytes            bigint,
    started_at       timestamptz,
    finished_at      timestamptz,
    CONSTRAINT batch_combines_status_known CHECK (status IN (
        'waiting', 'items_failed', 'pending', 'running', 'done', 'failed')),
    CONSTRAINT batch_combines_attempts_bounded
        CHECK (attempts >= 0 AND max_attempts >= 1 AND attempts <= max_attempts),
    CONSTRAINT batch_combines_running_has_lease
        CHECK ((status = 'running') = (lease_expires_at IS NOT NULL AND worker_id IS NOT NULL)),
    CONSTRAINT batch_combines_done_has_file
        CHECK ((status = 'done') = (object_key IS NOT NULL AND bytes IS NOT NULL)),
    CONSTRAINT batch_combines_finished_when_final
        CHECK ((status IN ('done', 'failed', 'items_failed')) = (finished_at IS NOT NULL))
);

-- The claim reads only due pending rows; the rescuer only running ones; retention by age.
CREATE INDEX batch_combines_due ON batch_combines (run_after, batch_id) WHERE status = 'pending';
CREATE INDEX batch_combines_lease ON batch_combines (lease_expires_at) WHERE status = 'running';
CREATE INDEX batch_combines_finished ON batch_combines (finished_at)
    WHERE finished_at IS NOT NULL;

CREATE FUNCTION batch_combines_check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status AND NOT (
           (OLD.status = 'waiting'      AND NEW.status IN ('pending', 'items_failed'))
        OR (OLD.status = 'items_failed' AND NEW.status IN ('waiting', 'pending'))
        OR (OLD.status = 'pending'      AND NEW.status = 'running')
        OR (OLD.status = 'running'      AND NEW.status IN ('pending', 'done', 'failed'))
    ) THEN
        RAISE EXCEPTION 'combined file of batch % cannot go from % to %',
            OLD.batch_id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER batch_combines_transition BEFORE UPDATE OF status ON batch_combines
    FOR EACH ROW EXECUTE FUNCTION batch_combines_check_transition();

-- The combined file as every API and transport shows it (its signed url is added when shown).
CREATE FUNCTION batch_combine_public(c batch_combines) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'status', CASE c.status WHEN 'waiting' THEN 'pending'
                                WHEN 'items_failed' THEN 'failed'
                                ELSE c.status END,
        'outline', c.outline,
        'attempts', c.attempts,
        'error', c.error,
        'pages', c.pages,
        'bytes', c.bytes,
        'finished_at', c.finished_at
    )
$$;

-- A batch's public JSON (as the migrations before this one make it) with its combined file
-- `c` (a row of nulls for a batch that did not ask: `combined` is null), and `status` done only
-- once the join is over, finished then.
CREATE FUNCTION batch_with_combined(shown jsonb, c batch_combines) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN c.batch_id IS NULL THEN shown || '{"combined": null}'::jsonb
        WHEN shown->>'status' = 'done' AND c.status NOT IN ('done', 'failed', 'items_failed')
            THEN shown || jsonb_build_object(
                'status', 'running', 'finished_at', NULL, 'combined', batch_combine_public(c))
        WHEN shown->>'status' = 'done'
            THEN shown || jsonb_build_object(
                'finished_at', greatest((shown->>'finished_at')::timestamptz, c.finished_at),
                'combined', batch_combine_public(c))
        ELSE shown || jsonb_build_object('combined', batch_combine_public(c))
    END
$$;

ALTER FUNCTION batch_public(batches) RENAME TO batch_public_without_combined;
CREATE FUNCTION batch_public(b batches) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT batch_with_combined(batch_public_without_combined(b),
                               (SELECT c FROM batch_combines c WHERE c.batch_id = b.id))
$$;

-- The items of a batch moved on (counts as batch_public shows them): its combined file `c`
-- waits, is due to be joined, or cannot be made; returned as it is now. Rows a process works
-- on (pending, running) and final ones are not the items' to move.
CREATE FUNCTION batch_combine_follow(c batch_combines, counts jsonb, total integer)
RETURNS batch_combines LANGUAGE plpgsql AS $$
DECLARE
    batch uuid := c.batch_id;
    next text;
    why text;
BEGIN
    IF c.status NOT IN ('waiting', 'items_failed') THEN
        RETURN c;
    END IF;
    next := CASE
        WHEN (counts->>'done')::integer = total THEN 'pending'
        WHEN (counts->>'done')::integer + (counts->>'failed')::integer
             + (counts->>'cancelled')::integer < total THEN 'waiting'
        ELSE 'items_failed' END;
    IF next = c.status THEN
        RETURN c;
    END IF;
    IF next = 'items_failed' THEN
        -- The first item that did not end done, by position, with its error; then how many
        -- others did not either.
        SELECT format('item %s %s%s', quote_literal(f.key),
                      CASE f.status WHEN 'cancelled' THEN 'was cancelled' ELSE 'failed' END,
                      coalesce(': ' || f.error, ''))
               || CASE WHEN f.others > 0
                       THEN format('; %s more items did not end done', f.others) ELSE '' END
        INTO why
        FROM (SELECT i.key, j.status, j.error, count(*) OVER () - 1 AS others
              FROM batch_items i JOIN jobs j ON j.id = i.job_id
              WHERE i.batch_id = batch AND j.status <> 'done'
              ORDER BY i.position
              LIMIT 1) f;
    END IF;
    UPDATE batch_combines
    SET status = next, error = why, run_after = now(),
        finished_at = CASE WHEN next = 'items_failed' THEN now() END
    WHERE batch_id = batch AND status = c.status
    RETURNING * INTO c;
    IF NOT FOUND THEN  -- moved meanwhile (nothing does, under the batch's lock): as it is
        SELECT * INTO c FROM batch_combines WHERE batch_id = batch;
    END IF;
    RETURN c;
END $$;

-- As 0004's, with the combined file followed first, under the same lock (see there for why
-- the batch's events stay in the order they were counted).
CREATE OR REPLACE FUNCTION batch_log_events(ids uuid[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    b batches;
    c batch_combines;
    shown jsonb;
    at_xid xid8;
BEGIN
    FOR b IN SELECT * FROM batches WHERE id = ANY(ids) ORDER BY id FOR UPDATE LOOP
        shown := batch_public_without_combined(b);
        SELECT * INTO c FROM batch_combines WHERE batch_id = b.id;
        IF FOUND THEN
            c := batch_combine_follow(c, shown->'counts', (shown->>'total')::integer);
        END IF;
        shown := batch_with_combined(shown, c);
        at_xid := greatest(pg_current_xact_id(), b.event_xid);
        INSERT INTO job_events (xid, job_id, tenant, type, payload)
        VALUES (at_xid, NULL, b.tenant,
                CASE shown->>'status' WHEN 'done' THEN 'batch.done' ELSE 'batch.progress' END,
                shown);
        UPDATE batches SET event_xid = at_xid WHERE id = b.id;
    END LOOP;
END $$;

-- A batch with combine and a webhook_url has its batch.done POSTed there as well, carrying the
-- combined file (or why there is none): the webhook outbox gets rows about a batch. Batches
-- without combine send what they sent before, their items' job events only.
ALTER TABLE webhook_deliveries
    ALTER COLUMN job_id DROP NOT NULL,
    ADD COLUMN batch_id uuid REFERENCES batches (id) ON DELETE CASCADE,
    ADD CONSTRAINT webhook_deliveries_subject CHECK ((job_id IS NULL) <> (batch_id IS NULL)),
    DROP CONSTRAINT webhook_deliveries_type_known,
    ADD CONSTRAINT webhook_deliveries_type_known
        CHECK (type IN ('job.done', 'job.failed', 'job.cancelled', 'batch.done'));
CREATE INDEX webhook_deliveries_batch ON webhook_deliveries (batch_id, created_at)
    WHERE batch_id IS NOT NULL;

-- Whether an event is one the outbox delivers: a job's final event, or the batch.done of a
-- batch with combine; either with a webhook_url.
CREATE FUNCTION event_is_delivered(type text, payload jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT payload->>'webhook_url' IS NOT NULL AND (
        type IN ('job.done', 'job.failed', 'job.cancelled')
        OR (type = 'batch.done' AND jsonb_typeof(payload->'combined') = 'object'))
$$;

-- 0010's, with the outbox rule above; the rest is unchanged.
CREATE OR REPLACE FUNCTION job_events_after_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    last_id bigint;
    queued boolean;
    started boolean;
    batches_only boolean;
    hooks boolean;
BEGIN
    SELECT max(a.id),
           bool_or(a.type IN ('job.queued', 'job.retrying')),
           bool_or(a.type = 'job.running'),
           bool_and(a.job_id IS NULL),
           bool_or(event_is_delivered(a.type, a.payload))
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

    IF queued AND started THEN
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

-- What the join does to a row (every such change goes to or from running: the claim, its end,
-- a rescue, a release) logs the batch's event, whichever statement made it. The items' moves
-- are not logged here: batch_log_events makes them and logs the event itself.
CREATE FUNCTION batch_combines_after_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    moved uuid[];
BEGIN
    moved := ARRAY(
        SELECT n.batch_id FROM changed n JOIN unchanged o ON o.batch_id = n.batch_id
        WHERE n.status IS DISTINCT FROM o.status AND 'running' IN (n.status, o.status));
    IF cardinality(moved) > 0 THEN
        PERFORM batch_log_events(moved);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER batch_combines_events AFTER UPDATE ON batch_combines
    REFERENCING OLD TABLE AS unchanged NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION batch_combines_after_update();
