-- Assets: files a tenant uploads once (images, fonts, stylesheets, …) and jobs map in by
-- relative path. Content-addressed: the id is sha256:<hex> of the bytes, which live in the
-- job storage at <tenant>/assets/<hex>; this row says they are there, and what they are.
CREATE TABLE assets (
    tenant       text        NOT NULL,
    id           text        NOT NULL,
    size         bigint      NOT NULL,
    content_type text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, id),
    CONSTRAINT assets_id_format CHECK (id ~ '^sha256:[0-9a-f]{64}$'),
    CONSTRAINT assets_size_known CHECK (size >= 0)
);

-- The assets a job's page uses: {"img/logo.png": {"id": "sha256:…", "content_type": …}},
-- resolved at submission (its template's map under its own). NULL for a job without any, so
-- the insert of such a job (the hot path) carries one NULL more and nothing else. Deleting an
-- asset looks for queued and running jobs that name it through jobs_tenant_in_flight (0003),
-- which bounds that search to the tenant's jobs in flight: no index on this column to keep up.
ALTER TABLE jobs ADD COLUMN assets jsonb;

-- A template version keeps the map it was stored with: {"img/logo.png": "sha256:…"}.
-- Adding a column with a default rewrites no row and fires no update trigger.
ALTER TABLE templates ADD COLUMN assets jsonb NOT NULL DEFAULT '{}';
