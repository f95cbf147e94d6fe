-- A tenant's own webhook endpoints: URLs that its events of the tenant as a whole
-- (template.published), which name no job and no batch, are POSTed to, signed with its webhook
-- secret like every delivery. `pressroom tenants webhooks` keeps them. Jobs and batches keep
-- naming their own URL in webhook_url, as before.
--
-- Safe with jobs in flight: a new table and a new trigger, and the outbox's CHECKs loosened
-- (every row they held meets the new ones; checking them is one pass over the outbox under its
-- lock, which holds up the outbox inserts of done writes for that long, as 0016's did). An
-- older process's sender would claim a tenant's delivery and POST it in a batch's shape
-- (`data.batch`): there is none until an endpoint is added, so add them once every process
-- runs this release.

-- The types are those an endpoint may take, a CHECKed list that grows with the tenant's events
-- (server/events: TENANT_TYPES). An endpoint whose delivery was answered 410 Gone is disabled
-- (disabled_at) and gets nothing until it is added again.
CREATE TABLE tenant_webhooks (
    tenant      text        NOT NULL REFERENCES tenants (name) ON DELETE CASCADE,
    url         text        NOT NULL,
    types       text[]      NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    disabled_at timestamptz,
    PRIMARY KEY (tenant, url),
    CONSTRAINT tenant_webhooks_types_known
        CHECK (cardinality(types) > 0 AND types <@ ARRAY['template.published'])
);

-- A tenant's delivery names neither a job nor a batch.
ALTER TABLE webhook_deliveries
    DROP CONSTRAINT webhook_deliveries_subject,
    ADD CONSTRAINT webhook_deliveries_subject CHECK (
        num_nonnulls(job_id, batch_id) = CASE WHEN type LIKE 'template.%' THEN 0 ELSE 1 END),
    DROP CONSTRAINT webhook_deliveries_type_known,
    ADD CONSTRAINT webhook_deliveries_type_known CHECK (type IN (
        'job.done', 'job.failed', 'job.cancelled', 'batch.done', 'template.published'));

-- A tenant's event goes to each of its endpoints that takes its type and is not disabled, in
-- the transaction that logs it, so a crash after publishing loses nothing; then one NOTIFY on
-- pressroom_webhooks, as job_events_after_insert sends for a job's delivery. A row trigger whose
-- WHEN only the tenant's events pass (neither a job's nor a batch's): the statements of jobs and
-- batches queue nothing and call nothing for it.
CREATE FUNCTION job_events_to_tenant_webhooks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_deliveries (tenant, url, type, payload)
    SELECT NEW.tenant, t.url, NEW.type, NEW.payload
    FROM tenant_webhooks t
    WHERE t.tenant = NEW.tenant AND NEW.type = ANY (t.types) AND t.disabled_at IS NULL;
    IF FOUND THEN
        PERFORM pg_notify('pressroom_webhooks', 'w');
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER job_events_tenant_webhooks AFTER INSERT ON job_events
    FOR EACH ROW
    WHEN (NEW.job_id IS NULL AND NEW.type NOT LIKE 'batch.%')
    EXECUTE FUNCTION job_events_to_tenant_webhooks();
