-- Channels, and the secrets that sign each tenant's subscription tokens.
--
-- A job, a batch and each batch item may carry a channel (one end user's documents, say),
-- shown in their public JSON and so in every event about them; streams and tokens can be
-- scoped to one channel.
--
-- An event's channel is read from its payload (the job or the batch as it was), through an
-- expression index: no column to fill on the hot insert path, no statement that must remember
-- it, and the events of jobs without a channel (most of them) are not in the index at all, so
-- they pay only for the partial index's predicate.

CREATE FUNCTION channel_valid(channel text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT channel ~ '^[A-Za-z0-9_.:@/-]{1,200}$'
$$;

ALTER TABLE jobs ADD COLUMN channel text
    CONSTRAINT jobs_channel_format CHECK (channel_valid(channel));
ALTER TABLE batches ADD COLUMN channel text
    CONSTRAINT batches_channel_format CHECK (channel_valid(channel));

-- The channel joins whatever the public JSON of a job or batch shows (other migrations add to
-- it too), rather than this file writing out every key again.
ALTER FUNCTION job_public(jobs) RENAME TO job_public_without_channel;
CREATE FUNCTION job_public(j jobs) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT job_public_without_channel(j) || jsonb_build_object('channel', j.channel)
$$;
ALTER FUNCTION batch_public(batches) RENAME TO batch_public_without_channel;
CREATE FUNCTION batch_public(b batches) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT batch_public_without_channel(b) || jsonb_build_object('channel', b.channel)
$$;

-- A channel's stream replays its events in log order (events_after with a channel).
CREATE INDEX job_events_channel ON job_events (tenant, (payload->>'channel'), xid, id)
    WHERE payload->>'channel' IS NOT NULL;
-- A channel's jobs, newest first (GET /v1/jobs?channel=, the dashboard's filter).
CREATE INDEX jobs_tenant_channel ON jobs (tenant, channel, created_at DESC, id DESC)
    WHERE channel IS NOT NULL;

-- Each tenant signs its subscription tokens (JWTs, HS256) with a secret of its own, so that
-- its backend can mint them without asking Pressroom; rotating it invalidates every token
-- signed with the old one. It is made with the tenant's row for a new tenant (its first key,
-- which shows it once); tenants whose rows predate it get theirs on first need (tenants.py).
ALTER TABLE tenants ADD COLUMN token_secret text
    CONSTRAINT tenants_token_secret_format CHECK (token_secret LIKE 'prts\_%');
