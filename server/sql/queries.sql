-- Every statement Pressroom runs, as named blocks read by server/sql/__init__.py.
-- A state change and its event rows are one statement, so one round trip and one implicit
-- transaction. What follows an event row (the NOTIFY, the webhook outbox row, batch events)
-- is written by the job_events trigger alone (0010_event_side_effects.sql): no statement
-- here repeats it.

-- insert_jobs --
-- $1..$12 are parallel arrays, one element per job (many requests share one transaction);
-- $13 holds the jobs' assets (NULL for a job without any); $14 and $15 each job's source and
-- sealed secrets; $16 each job's channel; $17 each job's traceparent (NULL: tracing off); $18
-- and $19 the name and version of the stored template it was made from (NULL: none); $20 its
-- cache key (NULL: it does not use the render cache). Each job comes with its job.queued event,
-- but for one that the render cache serves (render_cache_hit): that one is inserted done, with
-- the file of a done job of its tenant, and comes with its job.done event; its secrets are not
-- kept, as no attempt will read them.
WITH new AS (
    INSERT INTO jobs (id, tenant, template, data, options, metadata, webhook_url, priority,
                      max_attempts, run_after, idempotency_key, request_hash, channel,
                      assets, source, secrets, traceparent, template_name, template_version,
                      cache_key, cached_from, status, object_key, bytes, pages, provenance,
                      finishing, progress, finished_at)
    SELECT t.id, t.tenant, t.template, t.data, t.options, t.metadata, t.webhook_url, t.priority,
           t.max_attempts, coalesce(t.run_after, now()), t.idempotency_key, t.request_hash,
           t.channel, t.assets, t.source, CASE WHEN h.cached_from IS NULL THEN t.secrets END,
           t.traceparent, t.template_name, t.template_version, t.cache_key, h.cached_from,
           coalesce(h.status, 'queued'), h.object_key, h.bytes, h.pages, h.provenance,
           h.finishing, h.progress, h.finished_at
    FROM unnest($1::uuid[], $2::text[], $3::text[], $4::json[], $5::jsonb[], $6::jsonb[],
                $7::text[], $8::int[], $9::int[], $10::timestamptz[], $11::text[], $12::text[],
                $13::jsonb[], $14::text[], $15::bytea[], $16::text[], $17::text[], $18::text[],
                $19::int[], $20::text[])
         AS t(id, tenant, template, data, options, metadata, webhook_url, priority,
              max_attempts, run_after, idempotency_key, request_hash, assets, source,
              secrets, channel, traceparent, template_name, template_version, cache_key)
    LEFT JOIN LATERAL render_cache_hit(t.tenant, t.cache_key) h ON true
    RETURNING *
), ev AS (
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT id, tenant, CASE WHEN status = 'done' THEN 'job.done' ELSE 'job.queued' END,
           job_public(new::jobs)
    FROM new
    RETURNING job_id, payload
)
SELECT job_id AS id, payload AS job FROM ev;

-- claim_jobs --
-- One statement: pick due jobs without waiting on rows others hold, mark them running,
-- count the attempt, log the event. $1 = how many, $2 = worker id, $3 = lease seconds.
WITH picked AS (
    SELECT id FROM jobs
    WHERE status = 'queued' AND run_after <= now()
    ORDER BY priority DESC, run_after, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE jobs j
    SET status = 'running', attempts = j.attempts + 1, worker_id = $2,
        lease_expires_at = now() + make_interval(secs => $3), started_at = now(),
        updated_at = now(), progress = NULL
    WHERE j.id = ANY (ARRAY(SELECT id FROM picked))
    RETURNING j.*
), ev AS (
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT c.id, c.tenant, 'job.running', job_public(c::jobs) FROM claimed c
)
SELECT c.id, c.tenant, c.template, c.data, c.options, c.attempts, c.max_attempts, c.assets,
       c.source, c.secrets, c.traceparent, c.template_name, c.template_version
FROM claimed c
ORDER BY c.priority DESC, c.run_after, c.id;

-- finish_done_many --
-- Attempts of one worker ($2) are done: $1 ids, $3 attempts, $4 object keys, $5 sizes, $6 page
-- counts, $7 warnings, $8 the seconds of each phase (JSON, for job_attempts, 0032), $9 what
-- finishing did, $10 the provenance, $11 what preflight found (JSON or NULL, 0038) are parallel
-- arrays. One statement, so one NOTIFY. Only the worker
-- holding an attempt may finish it: a cancelled or rescued job stays as it is. A job already
-- done with the attempt's own file counts as finished: a retry of this write after its first
-- try committed but its answer was lost (a failover, a cut cable) must not disown that file.
-- Written in jobs_finish_done (0019), which keeps its plan (see there why).
SELECT id FROM jobs_finish_done($1::uuid[], $2::text, $3::int[], $4::text[], $5::bigint[],
                                $6::int[], $7::text[], $8::text[], $9::text[], $10::text[],
                                $11::text[]) AS id;

-- finish_failed --
-- A failed attempt: queued again after $5 seconds while attempts remain and the error is
-- transient ($6), else failed for good. The error joins the job's history; $8 holds the seconds
-- of each phase the attempt reached, which jobs_record_attempt keeps with the attempt (0032).
WITH failed AS (
    UPDATE jobs
    SET status = CASE WHEN $6::boolean AND attempts < max_attempts THEN 'queued' ELSE 'failed' END,
        run_after = CASE WHEN $6::boolean AND attempts < max_attempts
                         THEN now() + make_interval(secs => $5::float8) ELSE run_after END,
        finished_at = CASE WHEN $6::boolean AND attempts < max_attempts THEN NULL ELSE now() END,
        error = $4::text,
        errors = errors || jsonb_build_array(jsonb_build_object(
            'attempt', attempts, 'error', $4::text, 'at', now())),
        warnings = $7::jsonb, attempt_phases = $8::jsonb,
        lease_expires_at = NULL, worker_id = NULL, progress = NULL, updated_at = now()
    WHERE id = $1 AND status = 'running' AND worker_id = $2 AND attempts = $3
    RETURNING *
), ev AS (
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT f.id, f.tenant,
           CASE f.status WHEN 'queued' THEN 'job.retrying' ELSE 'job.failed' END,
           job_public(f::jobs)
    FROM failed f
)
SELECT f.id, f.status FROM failed f;

-- heartbeat --
-- Extend the lease of every job this worker still holds; the ids it no longer holds
-- (cancelled, rescued) are missing from the result and their renders are aborted.
UPDATE jobs SET lease_expires_at = now() + make_interval(secs => $3)
WHERE id = ANY($1::uuid[]) AND status = 'running' AND worker_id = $2
RETURNING id;

-- rescue_expired --
-- Jobs whose worker stopped renewing the lease: queued again, or failed when out of attempts.
WITH lost AS (
    SELECT id FROM jobs
    WHERE status = 'running' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), rescued AS (
    UPDATE jobs j
    SET status = CASE WHEN j.attempts < j.max_attempts THEN 'queued' ELSE 'failed' END,
        finished_at = CASE WHEN j.attempts < j.max_attempts THEN NULL ELSE now() END,
        run_after = now(),
        error = 'worker lost: lease expired during attempt ' || j.attempts,
        errors = j.errors || jsonb_build_array(jsonb_build_object(
            'attempt', j.attempts,
            'error', 'worker lost: lease expired during attempt ' || j.attempts,
            'at', now())),
        lease_expires_at = NULL, worker_id = NULL, progress = NULL, updated_at = now()
    WHERE j.id = ANY (ARRAY(SELECT id FROM lost))
    RETURNING j.*
), ev AS (
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT r.id, r.tenant,
           CASE r.status WHEN 'queued' THEN 'job.retrying' ELSE 'job.failed' END,
           job_public(r::jobs)
    FROM rescued r
)
SELECT r.id, r.status FROM rescued r;

-- release_jobs --
-- Graceful shutdown: give unfinished jobs back at once, without charging the attempt.
WITH released AS (
    UPDATE jobs
    SET status = 'queued', attempts = attempts - 1, run_after = now(),
        lease_expires_at = NULL, worker_id = NULL, progress = NULL, updated_at = now()
    WHERE id = ANY($1::uuid[]) AND status = 'running' AND worker_id = $2
    RETURNING *
), ev AS (
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT r.id, r.tenant, 'job.retrying', job_public(r::jobs) FROM released r
)
SELECT r.id FROM released r;

-- cancel_jobs --
-- The jobs of $1 (one, or a batch of a bulk cancel) that are queued or running, cancelled.
WITH cancelled AS (
    UPDATE jobs
    SET status = 'cancelled', lease_expires_at = NULL, worker_id = NULL,
        finished_at = now(), updated_at = now()
    WHERE id = ANY($1::uuid[]) AND tenant = $2 AND status IN ('queued', 'running')
    RETURNING *
), ev AS (
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT c.id, c.tenant, 'job.cancelled', job_public(c::jobs) FROM cancelled c
)
SELECT job_public(c::jobs) AS job FROM cancelled c;

-- retry_jobs --
-- The failed jobs of $1 (one, or a batch of a bulk retry) go back to the queue with fresh
-- attempts; not one whose secrets (cookie and header values, PDF passwords) were erased when it
-- failed (0012): it would run without them. Its attempts count from 1 again, so the phases its
-- last attempt left (0032) go: a new attempt 1 that ends without writing its own (rescued) must
-- not be given them.
WITH requeued AS (
    UPDATE jobs
    SET status = 'queued', attempts = 0, run_after = now(), finished_at = NULL,
        progress = NULL, attempt_phases = NULL, updated_at = now()
    WHERE id = ANY($1::uuid[]) AND tenant = $2 AND status = 'failed'
      AND NOT (options ? 'cookies' OR options ? 'headers' OR options ? 'encrypt')
    RETURNING *
), ev AS (
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT r.id, r.tenant, 'job.queued', job_public(r::jobs) FROM requeued r
)
SELECT job_public(r::jobs) AS job FROM requeued r;

-- get_job --
SELECT job_public(j) AS job, j.status, j.object_key, j.tenant
FROM jobs j WHERE j.id = $1 AND j.tenant = $2;

-- list_jobs --
-- Newest first; the cursor is the (created_at, id) of the last row of the previous page; $8
-- keeps one channel's jobs only; $9 is a search (queue/listing.py JobFilter): an id from $10 to
-- $11 (a prefix of ids; NULL when $9 is none), the idempotency key $9, or any metadata value
-- $9. Each of the three reads its own index. $12 keeps the jobs made from one stored template,
-- of any version, or of version $13 only (jobs_tenant_template, 0032). page_url: the page of a
-- page_url job; template_name and template_version: its stored template; for its source's label.
SELECT job_public(j) AS job, j.created_at, j.id, j.object_key, j.source,
       CASE WHEN j.source = 'page_url' THEN j.template END AS page_url,
       j.template_name, j.template_version
FROM jobs j
WHERE j.tenant = $1
  AND ($2::text IS NULL OR j.status = $2)
  AND ($3::timestamptz IS NULL OR j.created_at >= $3)
  AND ($4::timestamptz IS NULL OR j.created_at < $4)
  AND ($5::timestamptz IS NULL OR (j.created_at, j.id) < ($5, $6::uuid))
  AND ($8::text IS NULL OR j.channel = $8)
  AND ($9::text IS NULL OR j.id BETWEEN $10::uuid AND $11::uuid OR j.idempotency_key = $9
       OR j.metadata @@ ('$.* == ' || to_jsonb($9::text)::text)::jsonpath)
  AND ($12::text IS NULL
       OR j.template_name = $12 AND ($13::int IS NULL OR j.template_version = $13))
ORDER BY j.created_at DESC, j.id DESC
LIMIT $7;

-- count_jobs --
-- A tenant's jobs in each state of $8, filtered as list_jobs filters them but for the state: $2
-- and $3 the time range, $4 the channel, $5 the search with $6 and $7 its id range, $9 the
-- stored template and $10 its version. One count per state, each a run of jobs_tenant_tally
-- (0029) read from the index alone unless there is a search (a template's: jobs_tenant_template,
-- 0032): for a tenant holding most of the table, one GROUP BY over all its jobs was planned as a
-- scan of the whole table, 3x slower (docs/performance.md).
SELECT s.status, (
    SELECT count(*) FROM jobs j
    WHERE j.tenant = $1 AND j.status = s.status
      AND ($2::timestamptz IS NULL OR j.created_at >= $2)
      AND ($3::timestamptz IS NULL OR j.created_at < $3)
      AND ($4::text IS NULL OR j.channel = $4)
      AND ($5::text IS NULL OR j.id BETWEEN $6::uuid AND $7::uuid OR j.idempotency_key = $5
           OR j.metadata @@ ('$.* == ' || to_jsonb($5::text)::text)::jsonpath)
      AND ($9::text IS NULL
           OR j.template_name = $9 AND ($10::int IS NULL OR j.template_version = $10))
) AS n
FROM unnest($8::text[]) AS s(status);

-- next_due_at --
-- When the earliest queued job becomes due, so an idle worker sleeps exactly until then.
SELECT min(run_after) FROM jobs WHERE status = 'queued';

-- events_head --
-- The newest position that can no longer change: where a live reader starts. The order is by
-- the columns themselves (e.xid), not by the bigint shown as `xid`, so the index serves it.
SELECT e.xid::text::bigint AS xid, e.id FROM job_events e
WHERE e.xid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY e.xid DESC, e.id DESC
LIMIT 1;

-- events_after --
-- The final part of the log after a position, in log order, for every tenant (the hub) or
-- one tenant ($4), optionally of one job ($5), of some types only ($6) and of one channel
-- ($7: the events of its jobs and batches, read through job_events_channel). `held` says
-- whether committed events wait behind a transaction still running, so the reader should
-- look again soon. Always at least one row: with no events, the event columns are NULL.
-- $8: no event below this id is at or past the position's xid (events.py, `floor`), so the
-- partitions below it are neither planned nor read; `held` skips them too, since the newest
-- xid of each is below the position's, itself below the horizon.
-- The horizon is written out in both places rather than shared through a CTE: a CTE's value
-- cannot bound an index scan. `held` reads the newest xid of the log (one index entry, read
-- backwards) rather than asking whether one at or past the horizon EXISTS: for that, on a
-- log not analyzed since it grew, PostgreSQL chose a sequential scan of the whole log, on
-- every call. Both read the statement's one snapshot, so they agree.
SELECT e.id, e.xid, e.job_id, e.tenant, e.type, e.payload, e.created_at, held.held
FROM (SELECT (SELECT h.xid FROM job_events h WHERE h.id >= $8 ORDER BY h.xid DESC LIMIT 1)
             >= pg_snapshot_xmin(pg_current_snapshot()) AS held) held
LEFT JOIN LATERAL (
    SELECT e.id, e.xid::text::bigint AS xid, e.job_id, e.tenant, e.type, e.payload,
           e.created_at
    FROM job_events e
    WHERE (e.xid, e.id) > ($1::text::xid8, $2::bigint) AND e.id >= $8::bigint
      AND e.xid < pg_snapshot_xmin(pg_current_snapshot())
      AND ($4::text IS NULL OR e.tenant = $4)
      AND ($5::uuid IS NULL OR e.job_id = $5)
      AND ($6::text[] IS NULL OR e.type = ANY ($6::text[]))
      AND ($7::text IS NULL OR e.payload->>'channel' = $7)
    ORDER BY e.xid, e.id
    LIMIT $3
) e ON true
ORDER BY e.xid, e.id;

-- events_after_all --
-- events_after for every tenant, job and type: what the hub reads after every NOTIFY. A
-- statement of its own because the optional filters above make PostgreSQL plan that one
-- afresh on every call (a custom plan), while this one keeps its cached plan: it is written
-- in job_events_after_all (0017), which keeps it (see there why). $4 as $8 there.
SELECT * FROM job_events_after_all($1::text::xid8, $2, $3, $4);

-- event_position --
-- Where a client's Last-Event-ID stands in the log (none when pruned or unknown).
SELECT xid::text::bigint AS xid, id, job_id, tenant FROM job_events WHERE id = $1;

-- events_oldest_id --
SELECT min(id) FROM job_events;

-- events_next_id --
-- The next event id: a cursor at or past it was never given out by this server.
SELECT job_events_next_id();

-- event_log_ranges --
-- The log's ranges, oldest first (lo NULL: from the start), with whether each is sealed and
-- its newest xid (NULL: none) as the pass wrote them down (0017); and the overflow's lowest id
-- as a range never sealed, when it holds events (those of a burst that outran the ranges, in a
-- gap between two of them or past the last).
SELECT r.lo, s.hi IS NOT NULL AS sealed, s.newest_xid::text::bigint AS newest_xid
FROM job_events_ranges() r LEFT JOIN job_events_sealed s ON s.hi = r.hi
UNION ALL
SELECT min(id), false, NULL FROM job_events_overflow HAVING count(*) > 0
ORDER BY 1 NULLS FIRST;

-- extend_event_log --
-- The log's partitions ahead of its writers, each filling for about $1 seconds, at least $2
-- ids (0017_event_log_partitions.sql); how many were made.
SELECT job_events_extend(make_interval(secs => $1), $2);

-- prune_event_log --
-- The log's partitions whose newest event is older than $1 seconds, dropped: their names.
SELECT job_events_drop_expired(make_interval(secs => $1));

-- claim_webhooks --
-- Due deliveries for this sender ($2), the attempt counted and the row leased for $3 seconds.
-- The POST happens after this commits: no transaction stays open across the network. A job's
-- delivery carries the job's traceparent, which its span continues (a batch's and a tenant's
-- have none).
WITH due AS (
    SELECT id FROM webhook_deliveries
    WHERE status = 'pending' AND next_attempt_at <= now()
      AND (locked_until IS NULL OR locked_until < now())
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE webhook_deliveries w
SET attempts = w.attempts + 1, locked_by = $2,
    locked_until = now() + make_interval(secs => $3::float8)
WHERE w.id = ANY (ARRAY(SELECT id FROM due))
RETURNING w.id, w.job_id, w.batch_id, w.tenant, w.url, w.type, w.payload, w.attempts,
          w.created_at, (SELECT j.traceparent FROM jobs j WHERE j.id = w.job_id) AS traceparent;

-- record_webhook_attempt --
-- One attempt's outcome ($7: pending = retry in $8 s, delivered, failed, disabled) and its log
-- row. Only the sender still holding the lease moves the delivery on; the attempt is logged
-- either way. A 410 also stops the job's (or the batch's) other pending deliveries to the
-- same URL; for a tenant's delivery (no job, no batch), those of the tenant's endpoint, which
-- is disabled (tenant_webhooks.disabled_at) until it is added again.
WITH mine AS (
    UPDATE webhook_deliveries
    SET status = $7::text,
        next_attempt_at = CASE WHEN $7::text = 'pending'
                               THEN now() + make_interval(secs => $8::float8)
                               ELSE next_attempt_at END,
        delivered_at = CASE WHEN $7::text = 'delivered' THEN now() END,
        last_status_code = $4::int, last_error = $6::text,
        locked_until = NULL, locked_by = NULL
    WHERE id = $1 AND attempts = $2 AND locked_by = $3
    RETURNING id, job_id, batch_id, tenant, url
), logged AS (
    INSERT INTO webhook_attempts (delivery_id, attempt, status_code, duration_ms, error)
    SELECT id, $2, $4::int, $5::int, $6::text FROM webhook_deliveries WHERE id = $1
    ON CONFLICT DO NOTHING
), silenced AS (
    UPDATE webhook_deliveries w
    SET status = 'disabled', locked_until = NULL, locked_by = NULL,
        last_error = 'not sent: an earlier delivery to this URL was answered 410 Gone'
    FROM mine m
    WHERE $7::text = 'disabled'
      AND (w.job_id = m.job_id OR w.batch_id = m.batch_id
           OR (num_nonnulls(m.job_id, m.batch_id, w.job_id, w.batch_id) = 0
               AND w.tenant = m.tenant))
      AND w.url = m.url
      AND w.status = 'pending' AND w.id <> m.id
), endpoint AS (
    UPDATE tenant_webhooks t SET disabled_at = now()
    FROM mine m
    WHERE $7::text = 'disabled' AND num_nonnulls(m.job_id, m.batch_id) = 0
      AND t.tenant = m.tenant AND t.url = m.url
)
SELECT count(*) > 0 AS recorded FROM mine;

-- release_webhooks --
-- Shutdown: deliveries still in flight go back at once, without charging the attempt.
UPDATE webhook_deliveries
SET attempts = attempts - 1, locked_until = NULL, locked_by = NULL
WHERE id = ANY($1::uuid[]) AND locked_by = $2 AND status = 'pending';

-- job_webhooks --
-- The webhook summary shown with a job, oldest delivery first, as JSON like the job itself.
SELECT coalesce(jsonb_agg(jsonb_build_object(
           'id', id, 'type', type, 'status', status, 'attempts', attempts,
           'last_status_code', last_status_code, 'last_error', last_error,
           'next_attempt_at', CASE WHEN status = 'pending' THEN next_attempt_at END,
           'created_at', created_at, 'delivered_at', delivered_at)
         ORDER BY created_at, id), '[]'::jsonb)
FROM webhook_deliveries
WHERE job_id = $1 AND tenant = $2;

-- job_story --
-- A job's whole story (GET /v1/jobs/{id}/story), tenant-scoped, in one read: the job as shown,
-- its data as stored, its ended attempts (job_attempts) and the running one (the job row), its
-- events in log order (those not yet pruned), its webhook deliveries with every attempt of
-- each, and the batches it belongs to.
SELECT job_public(j) AS job, j.status, j.object_key, j.data::text AS data, j.source,
       j.template_name, j.template_version, j.assets,
       CASE WHEN j.source IN ('office', 'docx', 'pdfs') THEN j.template END AS files,
       CASE WHEN j.status = 'running' THEN jsonb_build_object(
           'attempt', j.attempts, 'worker_id', j.worker_id, 'started_at', j.started_at)
       END AS running,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'attempt', a.attempt, 'worker_id', a.worker_id, 'started_at', a.started_at,
                   'ended_at', a.ended_at, 'outcome', a.outcome, 'error', a.error,
                   'warnings', a.warnings, 'phases', a.phases) ORDER BY a.ended_at), '[]'::jsonb)
        FROM job_attempts a WHERE a.job_id = j.id) AS attempts,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'event_id', e.id, 'type', e.type, 'at', e.created_at,
                   'status', e.payload->>'status', 'attempt', (e.payload->>'attempts')::int,
                   'progress', (e.payload->>'progress')::int, 'error', e.payload->>'error')
                   ORDER BY e.xid, e.id), '[]'::jsonb)
        FROM job_events e WHERE e.job_id = j.id AND e.tenant = j.tenant) AS events,
       (SELECT coalesce(jsonb_agg(webhook_delivery_story(w) ORDER BY w.created_at, w.id),
                         '[]'::jsonb)
        FROM webhook_deliveries w WHERE w.job_id = j.id AND w.tenant = j.tenant) AS deliveries,
       (SELECT coalesce(jsonb_agg(jsonb_build_object('id', b.id, 'key', i.key)
                   ORDER BY b.created_at, b.id), '[]'::jsonb)
        FROM batch_items i JOIN batches b ON b.id = i.batch_id AND b.tenant = j.tenant
        WHERE i.job_id = j.id) AS batches
FROM jobs j WHERE j.id = $1 AND j.tenant = $2;

-- redeliver_webhook --
-- Delivery $2 of job $1 (tenant $3) back in the outbox, due now, unless it is pending already
-- (due, or in flight). Its attempts go on counting and its webhook-id stays: the same message,
-- signed afresh when it is sent; webhook_deliveries_requeued wakes the senders. Returns nothing
-- for an unknown delivery; `delivery` as queued, or NULL for one pending already.
WITH known AS (
    SELECT w.id, w.status FROM webhook_deliveries w
    WHERE w.id = $2 AND w.job_id = $1 AND w.tenant = $3
), again AS (
    UPDATE webhook_deliveries w
    SET status = 'pending', next_attempt_at = now(), delivered_at = NULL
    FROM known k
    WHERE w.id = k.id AND k.status <> 'pending'
    RETURNING w.*
)
SELECT (SELECT webhook_delivery_story(a::webhook_deliveries) FROM again a) AS delivery
FROM known;

-- retention_lock --
-- One sweeper (or one pass over the event log) at a time across processes; released when the
-- transaction ends.
SELECT pg_try_advisory_xact_lock($1);

-- expired_jobs --
-- Finished jobs past retention ($1 days), locked until this batch ($2 rows) is deleted.
-- Their options say which files each attempt wrote (the output's extension, a thumbnail).
-- `shared`: a job outside this batch points at its file too (the render cache, 0037: the job
-- that rendered it and those served from it), so the file stays.
WITH expired AS (
    SELECT id, tenant, attempts, max_attempts, object_key, options, cached_from, finished_at
    FROM jobs
    WHERE status IN ('done', 'failed', 'cancelled')
      AND finished_at < now() - make_interval(days => $1)
    ORDER BY finished_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
SELECT e.id, e.tenant, e.attempts, e.max_attempts, e.object_key, e.options,
       e.object_key IS NOT NULL AND EXISTS (
           SELECT 1 FROM jobs o
           WHERE (o.id = coalesce(e.cached_from, e.id)
                  OR o.cached_from = coalesce(e.cached_from, e.id))
             AND o.object_key = e.object_key AND o.id <> ALL (ARRAY(SELECT id FROM expired))
       ) AS shared
FROM expired e
ORDER BY e.finished_at;

-- delete_jobs --
-- Their webhook deliveries go with them (ON DELETE CASCADE); their events stay the log's, which
-- drops them with their partition (prune_event_log).
DELETE FROM jobs WHERE id = ANY($1::uuid[]);

-- api_key_create --
-- A tenant's first key makes its row too, with its own webhook signing secret ($5) and token
-- signing secret ($6); new_token_secret is that one, shown once, and NULL for a known tenant.
WITH tenant AS (
    INSERT INTO tenants (name, webhook_secret, token_secret) VALUES ($1, $5, $6)
    ON CONFLICT (name) DO NOTHING
    RETURNING token_secret
)
INSERT INTO api_keys (tenant, name, key_hash, prefix) VALUES ($1, $2, $3, $4)
RETURNING id, tenant, name, prefix, created_at, revoked_at, last_used_at,
          (SELECT token_secret FROM tenant) AS new_token_secret;

-- api_key_list --
SELECT id, tenant, name, prefix, created_at, revoked_at, last_used_at
FROM api_keys ORDER BY id;

-- api_key_revoke --
-- Revoking twice keeps the first time.
UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1
RETURNING id, tenant, name, prefix, created_at, revoked_at, last_used_at;

-- api_keys_active_ids --
-- Every unrevoked key: none means dev mode; a stream or token whose key is missing here is
-- closed or refused (a key made since is looked up alone: api_key_is_active).
SELECT id FROM api_keys WHERE revoked_at IS NULL;

-- api_key_is_active --
SELECT EXISTS (SELECT 1 FROM api_keys WHERE id = $1 AND revoked_at IS NULL);

-- api_key_lookup --
-- The tenants of active keys ($1 = their hashes: one key as a request presents it, or the keys
-- in use as the cache reads them again); last_used_at is written at most once a minute.
WITH found AS (
    SELECT id, tenant, key_hash, last_used_at FROM api_keys
    WHERE key_hash = ANY($1::text[]) AND revoked_at IS NULL
), touched AS (
    UPDATE api_keys k SET last_used_at = now()
    FROM found f
    WHERE k.id = f.id AND (f.last_used_at IS NULL OR f.last_used_at < now() - interval '1 minute')
)
SELECT id, tenant, key_hash FROM found;

-- tenant_webhook_secrets --
-- A tenant's ($1) signing secrets: the current one, and the one before it while the overlap
-- ($2 s) after the rotation lasts. has_keys tells a tenant without a row yet (its keys predate
-- the tenants table: make one) from the dev-mode tenant (no keys: the deployment's secret).
SELECT t.webhook_secret,
       CASE WHEN t.rotated_at > now() - make_interval(secs => $2::float8)
            THEN t.previous_webhook_secret END AS previous_webhook_secret,
       t.rotated_at + make_interval(secs => $2::float8) AS previous_until,
       CASE WHEN t.name IS NOT NULL THEN true
            ELSE EXISTS (SELECT 1 FROM api_keys k WHERE k.tenant = $1) END AS has_keys
FROM (VALUES ($1::text)) AS n (name) LEFT JOIN tenants t ON t.name = n.name;

-- tenant_create --
-- The row of a tenant that has keys ($1), with its first webhook signing secret ($2) and
-- token signing secret ($3).
INSERT INTO tenants (name, webhook_secret, token_secret)
SELECT $1, $2, $3 WHERE EXISTS (SELECT 1 FROM api_keys WHERE tenant = $1)
ON CONFLICT (name) DO NOTHING;

-- tenant_token_secrets --
-- The token signing secrets of these tenants ($1), NULL for none yet, whether each has an
-- active key (a tenant without one has no valid token), and its token keys (0021), which its
-- backend may sign tokens with instead. One row per name asked.
SELECT n.name, t.token_secret,
       EXISTS (SELECT 1 FROM api_keys k WHERE k.tenant = n.name AND k.revoked_at IS NULL)
           AS active,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                    'kid', tk.kid, 'algorithm', tk.algorithm, 'public_key', tk.public_key,
                    'thumbprint', tk.thumbprint)), '[]')
        FROM tenant_token_keys tk WHERE tk.tenant = n.name) AS token_keys
FROM unnest($1::text[]) AS n (name) LEFT JOIN tenants t ON t.name = n.name;

-- tenant_set_token_secret --
-- The tenant's ($1) token signing secret becomes $2: always with $3 (a rotation), else only
-- where it has none yet (made on first need, the same one for every process that races).
UPDATE tenants SET token_secret = CASE WHEN $3::boolean THEN $2 ELSE coalesce(token_secret, $2) END
WHERE name = $1
RETURNING token_secret;

-- tenant_render_cache --
-- The tenants whose jobs use the render cache unless they say otherwise: what each process
-- keeps for submissions (server/web/defaults.py).
SELECT name FROM tenants WHERE render_cache;

-- tenant_render_cache_of --
-- One tenant's ($1) default; no row for a tenant without one.
SELECT render_cache FROM tenants WHERE name = $1;

-- tenant_set_render_cache --
-- The tenant's ($1) default becomes $2; NULL when it was so already.
UPDATE tenants SET render_cache = $2 WHERE name = $1 AND render_cache <> $2 RETURNING name;

-- token_key_add --
-- A tenant's ($1) new token key: kid $2, algorithm $3, public key PEM $4, thumbprint $5.
INSERT INTO tenant_token_keys (tenant, kid, algorithm, public_key, thumbprint)
VALUES ($1, $2, $3, $4, $5)
RETURNING kid, algorithm, added_at;

-- token_key_of_thumbprint --
SELECT kid FROM tenant_token_keys WHERE tenant = $1 AND thumbprint = $2;

-- token_key_list --
SELECT kid, algorithm, added_at FROM tenant_token_keys WHERE tenant = $1 ORDER BY added_at, kid;

-- token_key_remove --
DELETE FROM tenant_token_keys WHERE tenant = $1 AND kid = $2 RETURNING kid;

-- tenant_rotate_webhook_secret --
-- The new secret ($2) signs from now on; the current one becomes the previous one, and the
-- one before that (a second rotation within the overlap) is dropped.
UPDATE tenants
SET previous_webhook_secret = webhook_secret, webhook_secret = $2, rotated_at = now()
WHERE name = $1;

-- tenant_origins --
-- Every tenant's own origins: what each process keeps for CORS (server/cors.py).
SELECT tenant, origin FROM tenant_origins;

-- tenant_origin_list --
SELECT origin FROM tenant_origins WHERE tenant = $1 ORDER BY origin;

-- tenant_origin_add --
-- NULL when the tenant ($1) had the origin ($2) already.
INSERT INTO tenant_origins (tenant, origin) VALUES ($1, $2)
ON CONFLICT DO NOTHING
RETURNING origin;

-- tenant_origin_remove --
-- NULL when the tenant ($1) did not have the origin ($2).
DELETE FROM tenant_origins WHERE tenant = $1 AND origin = $2 RETURNING origin;

-- tenant_webhook_list --
-- A tenant's ($1) own webhook endpoints (0040), each with its latest delivery: its state and
-- last error (NULL: none yet).
SELECT t.url, t.types, t.created_at, t.disabled_at, d.status AS last_status,
       d.created_at AS last_at, d.last_error
FROM tenant_webhooks t
LEFT JOIN LATERAL (
    SELECT w.status, w.created_at, w.last_error FROM webhook_deliveries w
    WHERE w.tenant = t.tenant AND w.url = t.url AND w.job_id IS NULL AND w.batch_id IS NULL
    ORDER BY w.created_at DESC LIMIT 1
) d ON true
WHERE t.tenant = $1
ORDER BY t.url;

-- tenant_webhook_add --
-- The tenant ($1) sends the types $3 of its own events to $2 from now on: a new endpoint, or
-- one it had, with these types, enabled again. `added`: it is new; `was_disabled`: since when
-- it was (410 Gone), NULL for none.
WITH before AS (
    SELECT disabled_at FROM tenant_webhooks WHERE tenant = $1 AND url = $2
)
INSERT INTO tenant_webhooks (tenant, url, types) VALUES ($1, $2, $3::text[])
ON CONFLICT (tenant, url) DO UPDATE SET types = EXCLUDED.types, disabled_at = NULL
RETURNING NOT EXISTS (SELECT 1 FROM before) AS added,
          (SELECT disabled_at FROM before) AS was_disabled;

-- tenant_webhook_remove --
-- The tenant ($1) sends nothing to $2 any more: the endpoint goes, and its deliveries still
-- pending with it (disabled, saying why). NULL when it had no such endpoint; else how many
-- deliveries were stopped.
WITH gone AS (
    DELETE FROM tenant_webhooks WHERE tenant = $1 AND url = $2 RETURNING url
), stopped AS (
    UPDATE webhook_deliveries w
    SET status = 'disabled', locked_until = NULL, locked_by = NULL,
        last_error = 'not sent: the endpoint was removed'
    FROM gone g
    WHERE w.tenant = $1 AND w.url = g.url AND w.job_id IS NULL AND w.batch_id IS NULL
      AND w.status = 'pending'
    RETURNING 1
)
SELECT (SELECT count(*) FROM stopped) AS stopped FROM gone;

-- tenant_in_flight --
SELECT count(*) FROM jobs WHERE tenant = $1 AND status IN ('queued', 'running');

-- idempotency_try_lock --
-- Held until the submitting transaction ends: a second request with the key meanwhile is told
-- to wait (409) instead of queueing behind the first.
SELECT pg_try_advisory_xact_lock(hashtextextended($1 || E'\n' || $2, 6));

-- idempotency_find --
-- The job a tenant's key ($1, $2) already made, and whether it is past retention ($3 s).
SELECT j.id, j.request_hash, job_public(j) AS job,
       j.created_at < now() - make_interval(secs => $3) AS expired
FROM jobs j WHERE j.tenant = $1 AND j.idempotency_key = $2;

-- idempotency_forget --
UPDATE jobs SET idempotency_key = NULL, request_hash = NULL WHERE id = $1;

-- idempotency_prune --
-- Keys older than retention ($1 s) are forgotten in batches, so they can be used again.
UPDATE jobs SET idempotency_key = NULL, request_hash = NULL
WHERE id IN (SELECT id FROM jobs
             WHERE idempotency_key IS NOT NULL AND created_at < now() - make_interval(secs => $1)
             LIMIT 10000);

-- template_lock --
-- One new version of a template at a time, so versions count up without gaps or collisions.
SELECT pg_advisory_xact_lock(hashtextextended($1 || E'\n' || $2, 7));

-- template_insert --
-- The next version of a tenant's template ($1, $2); the first one is version 1.
-- $3 is its HTML, or $7 its Word template's asset id (the other NULL); $8 its data contract
-- (NULL for none), $9 its samples.
INSERT INTO templates (tenant, name, version, html, options, sample_data, assets, docx,
                       data_schema, samples)
SELECT $1, $2, coalesce(max(version), 0) + 1, $3, $4::jsonb, $5::jsonb, $6::jsonb, $7,
       $8::jsonb, $9::jsonb
FROM templates WHERE tenant = $1 AND name = $2
RETURNING name, version, html, options, sample_data, assets, docx, data_schema, samples,
          published_at, created_at;

-- template_find --
-- Templates by (name, version) pairs ($2, $3), one row each. A NULL version means the latest
-- published one; with $4 (people reading, not jobs), the latest draft where none is published.
SELECT DISTINCT ON (r.name, r.version)
       r.name AS wanted_name, r.version AS wanted_version,
       t.name, t.version, t.html, t.options, t.sample_data, t.assets, t.docx, t.data_schema,
       t.samples, t.published_at, t.created_at
FROM unnest($2::text[], $3::int[]) AS r(name, version)
JOIN templates t ON t.tenant = $1 AND t.name = r.name
                AND (r.version IS NULL AND ($4 OR t.published_at IS NOT NULL)
                     OR t.version = r.version)
ORDER BY r.name, r.version, t.published_at IS NOT NULL DESC, t.version DESC;

-- template_versions --
SELECT version, published_at, created_at FROM templates WHERE tenant = $1 AND name = $2
ORDER BY version;

-- template_list --
-- The latest version of each of a tenant's templates, by name, after the cursor name $2, with
-- its latest published version (NULL: drafts only).
SELECT DISTINCT ON (name) name, version, created_at,
       count(*) OVER (PARTITION BY name) AS versions,
       max(version) FILTER (WHERE published_at IS NOT NULL) OVER (PARTITION BY name)
           AS published
FROM templates
WHERE tenant = $1 AND ($2::text IS NULL OR name > $2)
ORDER BY name, version DESC
LIMIT $3;

-- template_version_list --
-- A tenant's ($1) template $2, newest version first, below the cursor version $3, at most $4.
-- kind: html, or docx for a Word template (no HTML).
SELECT version, created_at, published_at,
       CASE WHEN html IS NULL THEN 'docx' ELSE 'html' END AS kind
FROM templates
WHERE tenant = $1 AND name = $2 AND ($3::int IS NULL OR version < $3)
ORDER BY version DESC
LIMIT $4;

-- template_publish --
-- Publish the draft $3 of the tenant's ($1) template $2 and keep what its checks found; the
-- caller holds template_lock. No row: it was published meanwhile.
WITH diff AS (
    INSERT INTO template_diffs (tenant, name, version, against, published, forced, threshold,
                                diff, images)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9::jsonb)
    ON CONFLICT (tenant, name, version) DO UPDATE
    SET against = EXCLUDED.against, published = EXCLUDED.published, forced = EXCLUDED.forced,
        threshold = EXCLUDED.threshold, diff = EXCLUDED.diff, images = EXCLUDED.images,
        created_at = now()
)
UPDATE templates SET published_at = now()
WHERE tenant = $1 AND name = $2 AND version = $3 AND $5 AND published_at IS NULL
RETURNING published_at;

-- template_announce --
-- template.published on the tenant's ($1) streams: the version as published ($2).
INSERT INTO job_events (job_id, tenant, type, payload)
VALUES (NULL, $1, 'template.published', $2::jsonb);

-- template_diff --
-- What the last publishing of a version found (without its images).
SELECT against, published, forced, threshold, diff, created_at FROM template_diffs
WHERE tenant = $1 AND name = $2 AND version = $3;

-- template_diff_image --
-- One image of a version's diff ($4: sample/page), base64.
SELECT images->>$4 AS image FROM template_diffs
WHERE tenant = $1 AND name = $2 AND version = $3;

-- template_asset_users --
-- The template versions of the tenant ($1) whose asset map names one of the assets $2, or
-- that are that Word template (its path: name@version.docx, the name its jobs give the file),
-- as (asset, name, version, path), newest version first within a name.
SELECT a.asset_id, t.name, t.version, a.path
FROM templates t
CROSS JOIN LATERAL (
    SELECT e.path, e.asset_id FROM jsonb_each_text(t.assets) AS e (path, asset_id)
    UNION ALL SELECT t.name || '@' || t.version || '.docx', t.docx WHERE t.docx IS NOT NULL
) AS a (path, asset_id)
WHERE t.tenant = $1 AND a.asset_id = ANY($2::text[])
ORDER BY a.asset_id, t.name, t.version DESC;

-- batch_lock --
-- One batch submission per tenant at a time: keys and batches are checked, then inserted.
SELECT pg_advisory_xact_lock(hashtextextended($1, 8));

-- batch_find --
SELECT id FROM batches WHERE tenant = $1 AND request_hash = $2;

-- batch_item_jobs --
-- The jobs a tenant's item keys ($2) already have, with the fingerprint of what each asked for.
-- Locked until the new batch commits: a change to one of them meanwhile would log its events
-- before this batch exists, and so would be missing from the batch's progress.
SELECT item_key, item_hash, id FROM jobs WHERE tenant = $1 AND item_key = ANY($2::text[])
ORDER BY id
FOR SHARE;

-- insert_batch --
INSERT INTO batches (id, tenant, request_hash, webhook_url, channel) VALUES ($1, $2, $3, $4, $5);

-- insert_batch_jobs --
-- A batch's new jobs, their events and all its item rows (new and reused jobs) in one
-- statement; its NOTIFY and the batch event follow from the job_events trigger, which counts
-- the items once they are all in (an item done at once counts as done).
-- $1..$12 are parallel arrays, one element per new job; $13 is the batch; $14..$16 give
-- every item's position, key and job id; $17 holds the new jobs' assets, $18 and $19 each new
-- job's source and sealed secrets, $20 each new job's channel, $21 its traceparent (the batch
-- request's trace), $22 and $23 its stored template's name and version, $24 its cache key.
-- As in insert_jobs, a new job that the render cache serves is inserted done with its
-- job.done event, the others queued with job.queued. Counts the new jobs, and of those with a
-- cache key, the hits and the misses.
WITH new AS (
    INSERT INTO jobs (id, tenant, template, data, options, metadata, webhook_url, priority,
                      max_attempts, run_after, item_key, item_hash, assets, source, secrets,
                      channel, traceparent, template_name, template_version, cache_key,
                      cached_from, status, object_key, bytes, pages, provenance, finishing,
                      progress, finished_at)
    SELECT t.id, t.tenant, t.template, t.data, t.options, t.metadata, t.webhook_url,
           t.priority, t.max_attempts, coalesce(t.run_after, now()), t.item_key, t.item_hash,
           t.assets, t.source, CASE WHEN h.cached_from IS NULL THEN t.secrets END, t.channel,
           t.traceparent, t.template_name, t.template_version, t.cache_key, h.cached_from,
           coalesce(h.status, 'queued'), h.object_key, h.bytes, h.pages, h.provenance,
           h.finishing, h.progress, h.finished_at
    FROM unnest($1::uuid[], $2::text[], $3::text[], $4::json[], $5::jsonb[], $6::jsonb[],
                $7::text[], $8::int[], $9::int[], $10::timestamptz[], $11::text[], $12::text[],
                $17::jsonb[], $18::text[], $19::bytea[], $20::text[], $21::text[], $22::text[],
                $23::int[], $24::text[])
         AS t(id, tenant, template, data, options, metadata, webhook_url, priority,
              max_attempts, run_after, item_key, item_hash, assets, source, secrets, channel,
              traceparent, template_name, template_version, cache_key)
    LEFT JOIN LATERAL render_cache_hit(t.tenant, t.cache_key) h ON true
    RETURNING *
), ev AS (
    INSERT INTO job_events (job_id, tenant, type, payload)
    SELECT n.id, n.tenant, CASE WHEN n.status = 'done' THEN 'job.done' ELSE 'job.queued' END,
           job_public(n::jobs)
    FROM new n
), items AS (
    INSERT INTO batch_items (batch_id, position, key, job_id)
    SELECT $13::uuid, position, key, job_id
    FROM unnest($14::int[], $15::text[], $16::uuid[]) AS t(position, key, job_id)
)
SELECT count(*) AS created,
       count(*) FILTER (WHERE n.cache_key IS NOT NULL AND n.cached_from IS NOT NULL) AS hits,
       count(*) FILTER (WHERE n.cache_key IS NOT NULL AND n.cached_from IS NULL) AS misses
FROM new n;

-- batch_announce --
-- The first event of a batch whose jobs all existed before (no job event fires the trigger);
-- its NOTIFY follows from the job_events trigger.
SELECT batch_log_events(ARRAY[$1::uuid]);

-- batch_get --
SELECT batch_public(b) AS batch FROM batches b WHERE b.id = $1 AND b.tenant = $2;

-- batch_items --
-- A batch's items in the order they were submitted, each with its job as the API shows it.
SELECT i.key, job_public(j) AS job
FROM batch_items i JOIN jobs j ON j.id = i.job_id
WHERE i.batch_id = $1
ORDER BY i.position;

-- batch_list --
-- A tenant's ($1) batches, newest first, after the cursor ($2, $3: the created_at and id of the
-- previous page's last batch), at most $4, each as the API shows it.
SELECT batch_public(b) AS batch, b.created_at, b.id
FROM batches b
WHERE b.tenant = $1 AND ($2::timestamptz IS NULL OR (b.created_at, b.id) < ($2, $3::uuid))
ORDER BY b.created_at DESC, b.id DESC
LIMIT $4;

-- metrics_jobs --
-- Jobs by state, in two parts that never overlap (a CHECK ties finished_at to the final
-- states), each read through an index instead of over every row (0007).
SELECT status, count(*) AS n FROM jobs WHERE status IN ('queued', 'running') GROUP BY status
UNION ALL
SELECT status, count(*) AS n FROM jobs WHERE finished_at IS NOT NULL GROUP BY status;

-- metrics_queue --
SELECT count(*) AS due, extract(epoch FROM now() - min(run_after)) AS oldest_due_age_s
FROM jobs WHERE status = 'queued' AND run_after <= now();

-- asset_lock --
-- One change to a tenant's assets at a time (uploads, deletes): the total checked against
-- the quota is the total stored, and a delete cannot remove bytes an upload just counted on.
SELECT pg_advisory_xact_lock(hashtextextended($1, 11));

-- asset_find --
-- A tenant's ($1) assets among these ids ($2); another tenant's are missing, like unknown ones.
SELECT id, size, content_type, created_at FROM assets WHERE tenant = $1 AND id = ANY($2::text[]);

-- asset_total --
SELECT coalesce(sum(size), 0)::bigint FROM assets WHERE tenant = $1;

-- asset_list --
-- A tenant's ($1) assets by id, after the cursor id $2, at most $3 (its primary key's order).
SELECT id, size, content_type, created_at FROM assets
WHERE tenant = $1 AND ($2::text IS NULL OR id > $2)
ORDER BY id
LIMIT $3;

-- asset_insert --
-- $2..$4 are parallel arrays, one element per new asset.
INSERT INTO assets (tenant, id, size, content_type)
SELECT $1, id, size, content_type
FROM unnest($2::text[], $3::bigint[], $4::text[]) AS t(id, size, content_type)
ON CONFLICT (tenant, id) DO NOTHING
RETURNING id, size, content_type, created_at;

-- asset_users --
-- Queued and running jobs of the tenant ($1) whose page or finishing uses one of the assets $2:
-- in its asset map, as an attachment, an image stamp or a Factur-X XML. Per asset, how many
-- (n) and the first few of them (jobs, oldest first, to name). One pass over the jobs in flight.
WITH used AS (
    SELECT DISTINCT j.id, j.created_at, u.asset_id
    FROM jobs j
    CROSS JOIN LATERAL (
        SELECT a.ref->>'id' FROM jsonb_each(coalesce(j.assets, '{}')) AS a (path, ref)
        UNION ALL SELECT j.options->'stamp'->>'asset'
        UNION ALL SELECT j.options->'facturx'->>'xml'
        UNION ALL SELECT jsonb_path_query(j.options, '$.attachments[*].asset') #>> '{}'
    ) AS u (asset_id)
    WHERE j.tenant = $1 AND j.status IN ('queued', 'running')
)
SELECT asset_id, count(*) AS n, (array_agg(id ORDER BY created_at, id))[1:5] AS jobs
FROM used
WHERE asset_id = ANY($2::text[])
GROUP BY asset_id;

-- asset_delete --
DELETE FROM assets WHERE tenant = $1 AND id = $2 RETURNING id;

-- batch_tenant --
-- Whose batch this is (a signed download link names the batch, not the tenant).
SELECT tenant FROM batches WHERE id = $1;

-- combine_insert --
-- A batch that asks for one combined PDF ($3: an outline entry per item; $5: its signature's
-- options, or NULL); before its items, so that their first batch event already follows it.
INSERT INTO batch_combines (batch_id, tenant, outline, max_attempts, sign)
VALUES ($1, $2, $3, $4, $5);

-- combine_claim --
-- One statement: pick due joins without waiting on rows others hold, mark them running under
-- this process's lease ($2, $3 seconds), count the attempt. $1 = how many. Here and below, the
-- batch's event follows from the batch_combines trigger (0016).
WITH picked AS (
    SELECT batch_id FROM batch_combines
    WHERE status = 'pending' AND run_after <= now()
    ORDER BY run_after, batch_id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE batch_combines c
SET status = 'running', attempts = c.attempts + 1, worker_id = $2,
    lease_expires_at = now() + make_interval(secs => $3), started_at = now()
WHERE c.batch_id = ANY (ARRAY(SELECT batch_id FROM picked))
RETURNING c.batch_id, c.tenant, c.attempts, c.max_attempts, c.outline, c.sign;

-- combine_items --
-- A batch's items in order, with what each job recorded of its file.
SELECT i.key, j.status, j.object_key
FROM batch_items i JOIN jobs j ON j.id = i.job_id
WHERE i.batch_id = $1
ORDER BY i.position;

-- combine_done --
-- The file of attempt $3 is stored: only the process ($2) still holding that attempt records it.
-- A join already done with this attempt's own file ($4, one key per attempt) counts as
-- recorded: a retry of this write after its first try committed but its answer was lost must
-- not disown, and delete, the file the batch now names.
WITH done AS (
    UPDATE batch_combines
    SET status = 'done', object_key = $4, pages = $5, bytes = $6, error = NULL,
        worker_id = NULL, lease_expires_at = NULL, finished_at = now()
    WHERE batch_id = $1 AND status = 'running' AND worker_id = $2 AND attempts = $3
    RETURNING batch_id
)
SELECT batch_id FROM done
UNION ALL
SELECT batch_id FROM batch_combines
WHERE batch_id = $1 AND status = 'done' AND object_key = $4 AND attempts = $3;

-- combine_failed --
-- A failed attempt: due again after $5 seconds while attempts remain and the error ($4) may
-- pass ($6), else failed for good.
UPDATE batch_combines
SET status = CASE WHEN $6::boolean AND attempts < max_attempts THEN 'pending' ELSE 'failed' END,
    run_after = CASE WHEN $6::boolean AND attempts < max_attempts
                     THEN now() + make_interval(secs => $5::float8) ELSE run_after END,
    finished_at = CASE WHEN $6::boolean AND attempts < max_attempts THEN NULL ELSE now() END,
    error = $4::text, worker_id = NULL, lease_expires_at = NULL
WHERE batch_id = $1 AND status = 'running' AND worker_id = $2 AND attempts = $3
RETURNING batch_id, status;

-- combine_heartbeat --
-- Extend the lease of every join this process ($2) still holds; those missing from the result
-- are no longer its own (rescued) and are abandoned.
UPDATE batch_combines SET lease_expires_at = now() + make_interval(secs => $3)
WHERE batch_id = ANY($1::uuid[]) AND status = 'running' AND worker_id = $2
RETURNING batch_id;

-- combine_rescue --
-- Joins whose process stopped renewing the lease: due again, or failed when out of attempts.
WITH lost AS (
    SELECT batch_id FROM batch_combines
    WHERE status = 'running' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE batch_combines c
SET status = CASE WHEN c.attempts < c.max_attempts THEN 'pending' ELSE 'failed' END,
    finished_at = CASE WHEN c.attempts < c.max_attempts THEN NULL ELSE now() END,
    run_after = now(),
    error = 'worker lost: lease expired during attempt ' || c.attempts,
    worker_id = NULL, lease_expires_at = NULL
WHERE c.batch_id = ANY (ARRAY(SELECT batch_id FROM lost))
RETURNING c.batch_id;

-- combine_release --
-- Shutdown: joins not finished go back at once, without charging the attempt.
UPDATE batch_combines
SET status = 'pending', attempts = attempts - 1, run_after = now(),
    worker_id = NULL, lease_expires_at = NULL
WHERE batch_id = ANY($1::uuid[]) AND status = 'running' AND worker_id = $2
RETURNING batch_id;

-- combine_file --
-- A tenant's ($2) batch and its combined file, for the download route (no row: no batch).
SELECT c.status, c.object_key,
       CASE WHEN c.batch_id IS NOT NULL THEN batch_combine_public(c)->>'status' END AS shown
FROM batches b LEFT JOIN batch_combines c ON c.batch_id = b.id
WHERE b.id = $1 AND b.tenant = $2;

-- expired_combines --
-- Batches whose combined file is final since more than $1 days, locked (the batch row, as a
-- job change locks it first) until this round ($2 rows) is deleted.
SELECT c.batch_id, c.tenant, c.attempts, c.max_attempts, c.object_key
FROM batch_combines c JOIN batches b ON b.id = c.batch_id
WHERE c.finished_at < now() - make_interval(days => $1)
ORDER BY c.finished_at
LIMIT $2
FOR UPDATE OF b SKIP LOCKED;

-- delete_batches --
-- Their items and combined rows go with them (ON DELETE CASCADE); their jobs stay.
DELETE FROM batches WHERE id = ANY($1::uuid[]);

-- delete_tenant_deliveries --
-- A tenant's own deliveries (no job, no batch: its template.published, 0040) settled more than
-- $1 days ago, with their attempts (ON DELETE CASCADE); a job's and a batch's go with it.
DELETE FROM webhook_deliveries
WHERE job_id IS NULL AND batch_id IS NULL AND status <> 'pending'
  AND created_at < now() - make_interval(days => $1);

-- job_stats_hour --
-- The tenant's ($1) jobs done and failed in each minute from $2 (the start of a minute) on,
-- with the submit→done seconds' p50 and p95 of those done; the row whose minute is NULL is the
-- whole span (GROUPING SETS: one pass). $2 is a parameter, not now() here, so that the planner
-- sees how recent it is and reads the span from jobs_finished rather than the whole table.
SELECT date_bin('1 minute', finished_at, $2) AS minute,
       count(*) FILTER (WHERE status = 'done') AS done,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at))
           FILTER (WHERE status = 'done') AS p50_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at))
           FILTER (WHERE status = 'done') AS p95_s
FROM jobs
WHERE tenant = $1 AND finished_at >= $2 AND status IN ('done', 'failed')
GROUP BY GROUPING SETS ((date_bin('1 minute', finished_at, $2)), ())
ORDER BY minute NULLS FIRST;

-- job_stats_queue --
-- The tenant's ($1) queue now: its queued jobs, those due (not waiting for a run_at or a
-- retry's backoff), and when the oldest due one was submitted. jobs_tenant_state_created.
SELECT now() AS at,
       count(*) AS depth,
       count(*) FILTER (WHERE run_after <= now()) AS due,
       min(created_at) FILTER (WHERE run_after <= now()) AS oldest_due_at
FROM jobs
WHERE tenant = $1 AND status = 'queued';
