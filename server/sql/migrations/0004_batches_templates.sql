-- Named, versioned templates; batches of jobs keyed by stable business keys; and batch
-- progress in the event log, written by a trigger in the same transaction as the job changes
-- that cause it, so every stream (and every replay by event id) carries it in order.

CREATE TABLE templates (
    tenant      text        NOT NULL,
    name        text        NOT NULL,
    version     integer     NOT NULL,
    html        text        NOT NULL,
    options     jsonb       NOT NULL DEFAULT '{}',
    sample_data jsonb       NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name, version),
    -- No '@': `name@version` names one version in template_id.
    CONSTRAINT templates_name_format CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$'),
    CONSTRAINT templates_version_positive CHECK (version >= 1)
);

-- A version is immutable: jobs and people refer to `name@version` and must get what they saw.
CREATE FUNCTION templates_refuse_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'template %@% is immutable; store a new version', OLD.name, OLD.version
        USING ERRCODE = 'check_violation';
END $$;

CREATE TRIGGER templates_immutable BEFORE UPDATE ON templates
    FOR EACH ROW EXECUTE FUNCTION templates_refuse_update();

-- An item's job is created once per (tenant, key); item_hash fingerprints what was asked for,
-- so the same key with other content can be refused.
ALTER TABLE jobs ADD COLUMN item_key text, ADD COLUMN item_hash text;
CREATE UNIQUE INDEX jobs_item_key ON jobs (tenant, item_key) WHERE item_key IS NOT NULL;

CREATE TABLE batches (
    id           uuid        PRIMARY KEY,
    tenant       text        NOT NULL,
    -- The same request again (same items, same webhook) answers with this batch.
    request_hash text        NOT NULL,
    webhook_url  text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- Where the batch's latest event stands in the log (see batch_log_events).
    event_xid    xid8
);
CREATE UNIQUE INDEX batches_request ON batches (tenant, request_hash);

-- A job may belong to several batches: a later batch naming an accepted key reuses its job.
CREATE TABLE batch_items (
    batch_id uuid    NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
    position integer NOT NULL,
    key      text    NOT NULL,
    job_id   uuid    NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    PRIMARY KEY (batch_id, position)
);
CREATE INDEX batch_items_job ON batch_items (job_id);

-- Batch events name no job (so a job's own stream never carries them).
ALTER TABLE job_events ALTER COLUMN job_id DROP NOT NULL;
ALTER TABLE job_events DROP CONSTRAINT job_events_type_known;
ALTER TABLE job_events ADD CONSTRAINT job_events_type_known CHECK (type IN (
    'job.queued', 'job.running', 'job.progress', 'job.retrying',
    'job.done', 'job.failed', 'job.cancelled', 'batch.progress', 'batch.done'));
ALTER TABLE job_events ADD CONSTRAINT job_events_subject
    CHECK ((job_id IS NULL) = (type LIKE 'batch.%'));

-- The batch as every API and transport shows it: counts of its jobs by state.
CREATE FUNCTION batch_public(b batches) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', b.id,
        'status', CASE WHEN c.final = c.total THEN 'done' ELSE 'running' END,
        'total', c.total,
        'counts', jsonb_build_object(
            'queued', c.queued, 'running', c.running, 'done', c.done,
            'failed', c.failed, 'cancelled', c.cancelled),
        'progress', CASE WHEN c.total = 0 THEN 100 ELSE (100 * c.final) / c.total END,
        'webhook_url', b.webhook_url,
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

-- Log one event for each of these batches: batch.done once all of its jobs are final, else
-- batch.progress. Each batch row is locked (in id order, so two transactions cannot deadlock)
-- before its jobs are counted, so concurrent changes count in turn, each seeing those committed
-- before it. The log is read in (xid, id) order, but xids are handed out before this lock is
-- taken; so a batch event is placed at the greater of its own xid and that of the batch's
-- previous event, and the batch's events stay in the order they were counted: progress never
-- goes backwards and batch.done comes last. That is safe for readers, which only read below
-- the oldest running xid: this transaction's own xid is not past it until it commits.
CREATE FUNCTION batch_log_events(ids uuid[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    b batches;
    shown jsonb;
    at_xid xid8;
BEGIN
    FOR b IN SELECT * FROM batches WHERE id = ANY(ids) ORDER BY id FOR UPDATE LOOP
        shown := batch_public(b);
        at_xid := greatest(pg_current_xact_id(), b.event_xid);
        INSERT INTO job_events (xid, job_id, tenant, type, payload)
        VALUES (at_xid, NULL, b.tenant,
                CASE shown->>'status' WHEN 'done' THEN 'batch.done' ELSE 'batch.progress' END,
                shown);
        UPDATE batches SET event_xid = at_xid WHERE id = b.id;
    END LOOP;
END $$;

-- After every statement that logs job state changes, in the same transaction: an event for
-- each batch those jobs belong to.
CREATE FUNCTION batch_events_after_job_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM batch_log_events(ARRAY(
        SELECT DISTINCT i.batch_id FROM added a JOIN batch_items i ON i.job_id = a.job_id
        WHERE a.type LIKE 'job.%' AND a.type <> 'job.progress'));
    RETURN NULL;
END $$;

CREATE TRIGGER job_events_batch_progress AFTER INSERT ON job_events
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION batch_events_after_job_events();
