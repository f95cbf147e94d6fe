-- The webhook outbox: one row per (job, final event) with a webhook_url, written in the same
-- statement as the state change, so a crash between the change and the POST loses nothing.

CREATE TABLE webhook_deliveries (
    -- Sent as the `webhook-id` header on every attempt, so receivers can de-duplicate.
    id               uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    job_id           uuid        NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    tenant           text        NOT NULL,
    url              text        NOT NULL,
    type             text        NOT NULL,
    -- The job's public JSON at the moment of the change; links and the download URL are
    -- added at send time, so a retry hours later still carries a URL that works.
    payload          jsonb       NOT NULL,
    status           text        NOT NULL DEFAULT 'pending',
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    -- A sender's lease on the row while its POST is in flight; no transaction stays open.
    locked_until     timestamptz,
    locked_by        text,
    last_status_code integer,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    CONSTRAINT webhook_deliveries_status_known
        CHECK (status IN ('pending', 'delivered', 'failed', 'disabled')),
    CONSTRAINT webhook_deliveries_type_known
        CHECK (type IN ('job.done', 'job.failed', 'job.cancelled')),
    CONSTRAINT webhook_deliveries_delivered_at
        CHECK ((status = 'delivered') = (delivered_at IS NOT NULL))
);

-- The sender's claim reads only pending rows, earliest due first.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX webhook_deliveries_job ON webhook_deliveries (job_id, created_at);

CREATE TABLE webhook_attempts (
    delivery_id uuid        NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    attempt     integer     NOT NULL,
    status_code integer,
    duration_ms integer     NOT NULL,
    error       text,
    at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (delivery_id, attempt)
);

-- Retention deletes finished jobs by age; this keeps the hourly sweep off a full scan.
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
