-- One row per tenant that has API keys, holding its own webhook signing secret: one secret for
-- the whole deployment let any tenant sign deliveries that another tenant's receiver accepts.
-- The row is written with the tenant's first key (api_key_create); tenants whose keys predate
-- this table get theirs on first need (tenants.py). The open dev mode's tenant, which has no
-- key, signs with PRESSROOM_WEBHOOK_SECRET instead.

CREATE TABLE tenants (
    name                    text        PRIMARY KEY,
    webhook_secret          text        NOT NULL,
    -- After a rotation the old secret signs too, until rotated_at plus the overlap setting,
    -- so receivers can switch without dropping a delivery.
    previous_webhook_secret text,
    rotated_at              timestamptz,
    created_at              timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT tenants_name
        CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$'),
    CONSTRAINT tenants_webhook_secret_format
        CHECK (webhook_secret LIKE 'whsec\_%'
               AND (previous_webhook_secret IS NULL OR previous_webhook_secret LIKE 'whsec\_%'))
);

-- "Does this tenant have keys?" decides whether it gets a secret of its own.
CREATE INDEX api_keys_tenant ON api_keys (tenant);
