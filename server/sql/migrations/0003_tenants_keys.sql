-- API keys, each bound to one tenant. Only a SHA-256 of the key is kept: keys are 256 random
-- bits, so a fast hash is as safe as a slow one and costs nothing per request. The prefix is
-- shown in listings so that people can tell their keys apart.

CREATE TABLE api_keys (
    id           bigserial   PRIMARY KEY,
    tenant       text        NOT NULL,
    name         text        NOT NULL DEFAULT '',
    key_hash     text        NOT NULL UNIQUE,
    prefix       text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz,
    last_used_at timestamptz,
    -- Tenants name folders in storage (<tenant>/<job>/<attempt>.pdf): no slashes, no dots first.
    CONSTRAINT api_keys_tenant_name
        CHECK (tenant ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$')
);

-- "Is any key active?" decides between dev mode and keyed mode.
CREATE INDEX api_keys_active ON api_keys (id) WHERE revoked_at IS NULL;

-- Every submission counts the tenant's jobs in flight against its cap.
CREATE INDEX jobs_tenant_in_flight ON jobs (tenant) WHERE status IN ('queued', 'running');

-- Idempotency keys are forgotten by age (jobs.idempotency_key is set to NULL).
CREATE INDEX jobs_idempotency_age ON jobs (created_at) WHERE idempotency_key IS NOT NULL;
