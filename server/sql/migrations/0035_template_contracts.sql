-- A template version may carry a data contract: `data_schema`, a JSON Schema (draft 2020-12)
-- that the data of its jobs must meet at submission (NULL: none, as before), and `samples`,
-- named data sets ({"paid": {...}, "long": {...}}) that its preview and the checks of
-- publishing render.
--
-- Safe with jobs in flight: nullable columns and a constant default change the catalog only;
-- older processes never read them.
ALTER TABLE templates
    ADD COLUMN data_schema jsonb,
    ADD COLUMN samples jsonb NOT NULL DEFAULT '{}';

-- A new version starts as a draft (published_at NULL): the jobs that name a template without a
-- version get its latest published version, and a draft only when they name it. Publishing
-- (POST /v1/templates/{name}@{version}/publish) sets published_at, the one change a version
-- allows. Every version stored before this migration was what its template's jobs got: each
-- is published as of its creation, so existing clients see no change.
ALTER TABLE templates ADD COLUMN published_at timestamptz;

CREATE OR REPLACE FUNCTION templates_refuse_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.published_at IS NULL
       AND to_jsonb(NEW) - 'published_at' = to_jsonb(OLD) - 'published_at' THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'template %@% is immutable; store a new version', OLD.name, OLD.version
        USING ERRCODE = 'check_violation';
END $$;

UPDATE templates SET published_at = created_at;

-- What the last publishing of a version found (server/render/diff.py), refused or not: per
-- sample, its pages, the text added and removed and the share of changed pixels per page
-- (`diff`), against the published version `against` (NULL for a template's first), and the
-- images of its changed pages, kept apart so that reading the diff does not read them:
-- {"sample/page": base64 PNG}.
CREATE TABLE template_diffs (
    tenant      text             NOT NULL,
    name        text             NOT NULL,
    version     integer          NOT NULL,
    against     integer,
    published   boolean          NOT NULL,
    forced      boolean          NOT NULL,
    threshold   double precision NOT NULL,
    diff        jsonb            NOT NULL,
    images      jsonb            NOT NULL DEFAULT '{}',
    created_at  timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name, version),
    FOREIGN KEY (tenant, name, version) REFERENCES templates ON DELETE CASCADE
);

-- Publishing logs a template.published event, naming no job (as batch events), so that the
-- tenant's streams announce it; no webhook carries it (webhooks are addressed per job and per
-- batch: docs/decisions/024).
ALTER TABLE job_events
    DROP CONSTRAINT job_events_type_known,
    ADD CONSTRAINT job_events_type_known CHECK (type IN (
        'job.queued', 'job.running', 'job.progress', 'job.retrying',
        'job.done', 'job.failed', 'job.cancelled', 'batch.progress', 'batch.done',
        'template.published')),
    DROP CONSTRAINT job_events_subject,
    ADD CONSTRAINT job_events_subject
        CHECK ((job_id IS NULL) = (type LIKE 'batch.%' OR type LIKE 'template.%'));
