-- Jobs are the queue; job_events is the log every push transport reads.

CREATE TABLE jobs (
    id               uuid PRIMARY KEY,
    tenant           text        NOT NULL,
    status           text        NOT NULL DEFAULT 'queued',
    template         text        NOT NULL,
    data             jsonb       NOT NULL DEFAULT '{}',
    options          jsonb       NOT NULL DEFAULT '{}',
    metadata         jsonb       NOT NULL DEFAULT '{}',
    webhook_url      text,
    priority         integer     NOT NULL DEFAULT 0,
    attempts         integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL,
    run_after        timestamptz NOT NULL DEFAULT now(),
    lease_expires_at timestamptz,
    worker_id        text,
    progress         integer,
    error            text,
    errors           jsonb       NOT NULL DEFAULT '[]',
    warnings         jsonb       NOT NULL DEFAULT '[]',
    idempotency_key  text,
    request_hash     text,
    object_key       text,
    bytes            bigint,
    pages            integer,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    CONSTRAINT jobs_status_known
        CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled')),
    CONSTRAINT jobs_attempts_bounded
        CHECK (attempts >= 0 AND max_attempts >= 1 AND attempts <= max_attempts),
    CONSTRAINT jobs_running_has_lease
        CHECK (status <> 'running' OR (lease_expires_at IS NOT NULL AND worker_id IS NOT NULL)),
    CONSTRAINT jobs_done_has_file
        CHECK (status <> 'done' OR (object_key IS NOT NULL AND bytes IS NOT NULL)),
    CONSTRAINT jobs_finished_when_final
        CHECK ((status IN ('done', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT jobs_progress_percent
        CHECK (progress IS NULL OR progress BETWEEN 0 AND 100)
);

-- The claim reads only due queued jobs, best first.
CREATE INDEX jobs_due ON jobs (priority DESC, run_after, id) WHERE status = 'queued';
CREATE INDEX jobs_lease ON jobs (lease_expires_at) WHERE status = 'running';
CREATE INDEX jobs_tenant_created ON jobs (tenant, created_at DESC, id DESC);
CREATE UNIQUE INDEX jobs_idempotency ON jobs (tenant, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Transitions allowed by the state machine; everything else is refused by the database itself.
CREATE FUNCTION jobs_check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status AND NOT (
           (OLD.status = 'queued'  AND NEW.status IN ('running', 'cancelled'))
        OR (OLD.status = 'running' AND NEW.status IN ('queued', 'done', 'failed', 'cancelled'))
        OR (OLD.status = 'failed'  AND NEW.status = 'queued')
    ) THEN
        RAISE EXCEPTION 'job % cannot go from % to %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER jobs_transition BEFORE UPDATE OF status ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_check_transition();

-- The job as every API and transport shows it; events store it as it was at that moment.
CREATE FUNCTION job_public(j jobs) RETURNS jsonb LANGUAGE sql STABLE AS $$
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
        'pages', j.pages,
        'bytes', j.bytes,
        'run_after', j.run_after,
        'created_at', j.created_at,
        'updated_at', j.updated_at,
        'started_at', j.started_at,
        'finished_at', j.finished_at
    )
$$;

-- Event ids come from a sequence, so two transactions can commit in the opposite order of
-- their ids. Readers therefore order by (xid, id) and only read below the oldest running
-- transaction (pg_snapshot_xmin): that prefix of the log never changes again.
CREATE TABLE job_events (
    id         bigserial   PRIMARY KEY,
    xid        xid8        NOT NULL DEFAULT pg_current_xact_id(),
    job_id     uuid        NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    tenant     text        NOT NULL,
    type       text        NOT NULL,
    payload    jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT job_events_type_known CHECK (type IN (
        'job.queued', 'job.running', 'job.progress', 'job.retrying',
        'job.done', 'job.failed', 'job.cancelled'))
);

CREATE INDEX job_events_position ON job_events (xid, id);
CREATE INDEX job_events_job ON job_events (job_id, xid, id);
CREATE INDEX job_events_created ON job_events (created_at);
