-- The origins whose pages may call the API, the streams, the downloads and Socket.IO for one
-- tenant, beside PRESSROOM_CORS_ORIGINS, which allows its origins for every tenant
-- (server/cors.py). Each is written as a browser sends it in Origin, checked by the rule that
-- checks the setting (settings.check_origin) before it is stored; every process keeps them
-- all in memory and reads them again every PRESSROOM_AUTH_CACHE_S / 2.
--
-- Only a tenant with keys has a row in tenants, so only such a tenant can have origins.

CREATE TABLE tenant_origins (
    tenant     text        NOT NULL REFERENCES tenants (name) ON DELETE CASCADE,
    origin     text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, origin)
);
