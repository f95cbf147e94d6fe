-- Each function once, under its own name. 0014 and 0016 added keys to the public JSON of a
-- job and of a batch by renaming the function and wrapping it under the old name: job_public
-- called job_public_without_channel; batch_public called batch_public_without_combined, which
-- called batch_public_without_channel. Those copies go, and each function says all it does, as
-- server/sql/schema.sql states it. What each returns is unchanged, key for key (jsonb keeps
-- one order of keys whichever way an object was built).
--
-- job_public, batch_public and the new batch_from_items are SQL functions, STABLE, one SELECT
-- each, as before: PostgreSQL still inlines them into the statements that call them (every
-- state change, the done write of 0019), so those plans stay as they were. batch_from_items is
-- the part of a batch's JSON its items make, before its combined file: batch_log_events moves
-- the combined file on from it (0016), and batch_public adds the file to it.
--
-- Safe with jobs in flight: this runs in one transaction (server/queue/db.py), so every other
-- session sees the old functions or the new ones. A statement already inside the old
-- batch_log_events when the copies go would look for one at its next batch, and fail; so this
-- first holds the log's writers back, as job_events_extend does (SHARE waits for the
-- transactions that wrote events and keeps new ones at their INSERT until this commits). A
-- job's state change, whose trigger calls batch_log_events, then ended before or starts its
-- trigger after, on the new functions. Left is a join's statement moving several batches at
-- once (the combine claim, rescue or release) caught inside it: it fails whole, changing
-- nothing, and is made again at the next pass. Reads go on meanwhile.
LOCK TABLE job_events IN SHARE MODE;

CREATE OR REPLACE FUNCTION job_public(j jobs) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', j.id,
        'status', j.status,
        'attempts', j.attempts,
        'max_attempts', j.max_attempts,
        'priority', j.priority,
        'progress', j.progress,
        'error', j.error,
        'errors', j.errors,
        'warnings', j.warnings,
        'options', j.options,
        'metadata', j.metadata,
        'webhook_url', j.webhook_url,
        'channel', j.channel,
        'pages', j.pages,
        'bytes', j.bytes,
        'run_after', j.run_after,
        'created_at', j.created_at,
        'updated_at', j.updated_at,
        'started_at', j.started_at,
        'finished_at', j.finished_at
    )
$$;

CREATE FUNCTION batch_from_items(b batches) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', b.id,
        'status', CASE WHEN c.final = c.total THEN 'done' ELSE 'running' END,
        'total', c.total,
        'counts', jsonb_build_object(
            'queued', c.queued, 'running', c.running, 'done', c.done,
            'failed', c.failed, 'cancelled', c.cancelled),
        'progress', CASE WHEN c.total = 0 THEN 100 ELSE (100 * c.final) / c.total END,
        'webhook_url', b.webhook_url,
        'channel', b.channel,
        'created_at', b.created_at,
        'finished_at', CASE WHEN c.final = c.total THEN c.last_finished END
    )
    FROM (
        SELECT count(*) AS total,
               count(*) FILTER (WHERE j.status = 'queued') AS queued,
               count(*) FILTER (WHERE j.status = 'running') AS running,
               count(*) FILTER (WHERE j.status = 'done') AS done,
               count(*) FILTER (WHERE j.status = 'failed') AS failed,
               count(*) FILTER (WHERE j.status = 'cancelled') AS cancelled,
               count(*) FILTER (WHERE j.status IN ('done', 'failed', 'cancelled')) AS final,
               max(j.finished_at) AS last_finished
        FROM batch_items i JOIN jobs j ON j.id = i.job_id
        WHERE i.batch_id = b.id
    ) c
$$;

CREATE OR REPLACE FUNCTION batch_public(b batches) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT batch_with_combined(batch_from_items(b),
                               (SELECT c FROM batch_combines c WHERE c.batch_id = b.id))
$$;

CREATE OR REPLACE FUNCTION batch_log_events(ids uuid[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    b batches;
    c batch_combines;
    shown jsonb;
    at_xid xid8;
BEGIN
    FOR b IN SELECT * FROM batches WHERE id = ANY(ids) ORDER BY id FOR UPDATE LOOP
        shown := batch_from_items(b);
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

DROP FUNCTION job_public_without_channel(jobs);
DROP FUNCTION batch_public_without_combined(batches);
DROP FUNCTION batch_public_without_channel(batches);
