-- Pressroom's schema as it stands today, top to bottom: each table, index, constraint, trigger
-- and function once, under its own name, grouped by concern.
--
-- This file is documentation that is checked, not what a server runs: the migrations
-- (migrations/NNNN_*.sql, applied by server/queue/db.py at start) are the only way a database
-- gets here, from any earlier schema. tests/integration/test_schema.py migrates an empty
-- database, loads this file into another and compares the two; a change to the schema is a new
-- migration and the same change here. The migration runner's own table, schema_migrations
-- (which migrations were applied, and when), is the runner's and is not stated here.
--
-- 1. Jobs: the queue, its state machine, a job's public JSON
-- 2. The event log: job_events, partitioned by id, and the functions that keep it
-- 3. Templates
-- 4. Batches and their combined PDFs
-- 5. Webhooks: the outbox and its attempts
-- 6. The write path: what follows an event row (one trigger; a tenant's events' deliveries,
--    a second), the done write
-- 7. Tenants and keys
-- 8. Assets
--
-- The why of each rule is told at greater length by the migration that made it (its number is
-- given where it helps), in docs/write-path.md and docs/architecture.md, and with its figures
-- in docs/decisions/.


-- ---------------------------------------------------------------------------------------------
-- 1. Jobs
-- ---------------------------------------------------------------------------------------------

-- A channel (one end user's documents, say) that a job or a batch may carry and that streams
-- and tokens can be scoped to; the jobs' and batches' CHECKs call it.
CREATE FUNCTION channel_valid(channel text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT channel ~ '^[A-Za-z0-9_.:@/-]{1,200}$'
$$;

-- One row per job: the queue itself (status, priority, run_after, the lease), what was asked
-- (source, template, data, options, assets), and what came of it (the PDF's object key, bytes
-- and pages, the last error and the history of errors). The columns are in the order the
-- migrations added them; the row type `jobs` (job_public's argument) has that order too.
CREATE TABLE jobs (
    id               uuid        PRIMARY KEY,
    tenant           text        NOT NULL,
    status           text        NOT NULL DEFAULT 'queued',
    -- The source's text: the Jinja2 HTML, the Jinja2 Markdown, the page's URL, or the Office
    -- file's name, the file itself in `assets` under that name (`source`, 0027); for `pdfs`,
    -- the uploaded PDFs as JSON, [{"path", "title"}], each in `assets` under its path (0028);
    -- for `docx`, the Word template's name, as for an Office file, with the images its data
    -- places in `assets` too (0031).
    template         text        NOT NULL,
    -- As submitted: json, not jsonb, which would reorder keys and rewrite numbers (0006).
    data             json        NOT NULL DEFAULT '{}',
    options          jsonb       NOT NULL DEFAULT '{}',
    metadata         jsonb       NOT NULL DEFAULT '{}',
    webhook_url      text,
    priority         integer     NOT NULL DEFAULT 0,
    -- Counted at the claim; the claim, a retry and a rescue compare it with max_attempts.
    attempts         integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL,
    run_after        timestamptz NOT NULL DEFAULT now(),
    -- The worker's lease while running, renewed by its heartbeat; the rescuer takes back
    -- running jobs whose lease ran out.
    lease_expires_at timestamptz,
    worker_id        text,
    progress         integer,
    error            text,
    errors           jsonb       NOT NULL DEFAULT '[]',
    warnings         jsonb       NOT NULL DEFAULT '[]',
    -- Scoped per tenant (jobs_idempotency); forgotten by age (set to NULL).
    idempotency_key  text,
    request_hash     text,
    object_key       text,
    bytes            bigint,
    pages            integer,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    -- A batch item's job is made once per (tenant, item_key); item_hash fingerprints what it
    -- asked for, so the same key with other content can be refused.
    item_key         text,
    item_hash        text,
    -- The assets its page uses, {"img/logo.png": {"id": "sha256:…", "content_type": …}},
    -- resolved at submission; NULL for a job without any (the hot insert carries one NULL).
    assets           jsonb,
    source           text        NOT NULL DEFAULT 'template',
    -- Cookie and header values and PDF passwords, sealed with the server's secret; never in
    -- job_public, erased by jobs_secrets_erased when the job ends.
    secrets          bytea,
    channel          text        CONSTRAINT jobs_channel_format CHECK (channel_valid(channel)),
    -- The W3C traceparent of the request that submitted it (server/tracing.py), which its
    -- attempts' spans and webhook deliveries continue; NULL while tracing is off (0026).
    traceparent      text,
    -- What its finishing reports: the document information set, the sizes before and after
    -- compress (server/pdf/finishing.py); NULL when it reports nothing (0028).
    finishing        jsonb,
    -- The stored template it was made from (template_id), by name and version, for the list's
    -- label and filter; NULL for a job made from none (0032).
    template_name    text,
    template_version integer,
    -- The seconds the attempt that ended last spent in each phase of its worker, tagged with
    -- its number ({"attempt": 2, "template": 0.01, ...}), written by the statement that ends
    -- it; jobs_record_attempt copies them into its job_attempts row (0032).
    attempt_phases   jsonb,
    -- What made its PDF (server/pdf/provenance.py) and what its preflight checks found
    -- ([{kind, page, detail}], server/render/preflight.py; NULL when they did not run) (0033).
    provenance       jsonb,
    preflight        jsonb,
    -- The render cache (0037): the SHA-256 of what makes its PDF, for a job that asked for the
    -- cache (NULL otherwise), and the job that rendered the file it points at, for one served
    -- from it (NULL: rendered by itself).
    cache_key        text,
    cached_from      uuid,
    -- The state machine (DESIGN.md, "Job states"); jobs_check_transition refuses the moves.
    CONSTRAINT jobs_status_known
        CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled')),
    CONSTRAINT jobs_attempts_bounded
        CHECK (attempts >= 0 AND max_attempts >= 1 AND attempts <= max_attempts),
    CONSTRAINT jobs_running_has_lease
        CHECK (status <> 'running' OR (lease_expires_at IS NOT NULL AND worker_id IS NOT NULL)),
    -- `done` means the PDF is stored.
    CONSTRAINT jobs_done_has_file
        CHECK (status <> 'done' OR (object_key IS NOT NULL AND bytes IS NOT NULL)),
    CONSTRAINT jobs_finished_when_final
        CHECK ((status IN ('done', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT jobs_progress_percent
        CHECK (progress IS NULL OR progress BETWEEN 0 AND 100),
    CONSTRAINT jobs_source_known
        CHECK (source IN ('template', 'markdown', 'page_url', 'office', 'pdfs', 'docx'))
);

-- The claim reads only due queued jobs, best first; the rescuer only running ones.
CREATE INDEX jobs_due ON jobs (priority DESC, run_after, id) WHERE status = 'queued';
CREATE INDEX jobs_lease ON jobs (lease_expires_at) WHERE status = 'running';
-- A tenant's jobs, newest first (GET /v1/jobs); in one state but done (?status=, 0008); of one
-- channel (?channel=, 0014); an id prefix (?q=) reads the primary key.
CREATE INDEX jobs_tenant_created ON jobs (tenant, created_at DESC, id DESC);
CREATE INDEX jobs_tenant_state_created ON jobs (tenant, status, created_at DESC, id DESC)
    WHERE status <> 'done';
CREATE INDEX jobs_tenant_channel ON jobs (tenant, channel, created_at DESC, id DESC)
    WHERE channel IS NOT NULL;
-- Of one stored template (?template=name, or name@version: the version and the state are read
-- from the entry, for the list and its counts; 0032).
CREATE INDEX jobs_tenant_template
    ON jobs (tenant, template_name, created_at DESC, id DESC, template_version, status)
    WHERE template_name IS NOT NULL;
-- The dashboard's search by metadata value (?q=, any key's value: jsonb_ops answers `$.*`)
-- and its counts by state, read from the index alone (GET /v1/jobs/counts, 0029).
CREATE INDEX jobs_metadata_values ON jobs USING gin (metadata);
CREATE INDEX jobs_tenant_tally ON jobs (tenant, status, channel, created_at);
CREATE UNIQUE INDEX jobs_idempotency ON jobs (tenant, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX jobs_idempotency_age ON jobs (created_at) WHERE idempotency_key IS NOT NULL;
CREATE UNIQUE INDEX jobs_item_key ON jobs (tenant, item_key) WHERE item_key IS NOT NULL;
-- A tenant's jobs in flight, counted against its cap at every submission; with jobs_finished,
-- /metrics counts jobs by state from indexes alone (0007). Retention walks jobs_finished by age.
CREATE INDEX jobs_tenant_in_flight ON jobs (tenant) WHERE status IN ('queued', 'running');
CREATE INDEX jobs_finished ON jobs (finished_at) INCLUDE (status) WHERE finished_at IS NOT NULL;
-- The render cache's lookup: a tenant's done jobs by key; the jobs served from a job's file,
-- which retention keeps while one of them stays (0037).
CREATE INDEX jobs_tenant_cache ON jobs (tenant, cache_key)
    WHERE status = 'done' AND cache_key IS NOT NULL;
CREATE INDEX jobs_cached_from ON jobs (cached_from) WHERE cached_from IS NOT NULL;

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

-- A job's secrets are kept only while it may still run: its final state erases them, whichever
-- statement sets it. The condition is all a job without secrets pays: no function call.
CREATE FUNCTION jobs_erase_secrets() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.secrets := NULL;
    RETURN NEW;
END $$;

CREATE TRIGGER jobs_secrets_erased BEFORE UPDATE ON jobs
    FOR EACH ROW
    WHEN (NEW.secrets IS NOT NULL AND NEW.status IN ('done', 'failed', 'cancelled'))
    EXECUTE FUNCTION jobs_erase_secrets();

-- One row per attempt that ended, for a job's story (GET /v1/jobs/{id}/story): its worker, start
-- and end, how it ended, its error and warnings (0030), and the seconds it spent in each phase
-- its worker reached (template, render, finishing, store; 0032: NULL where no statement wrote
-- them, as for a rescued, released or cancelled attempt). The job row keeps only its last
-- attempt's worker and start, and its events name no worker, so the move out of `running`
-- writes it, whichever statement makes that move; attempts still running are the job row's.
-- released: handed back at shutdown, not counted (the next attempt has its number again).
CREATE TABLE job_attempts (
    job_id     uuid        NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt    integer     NOT NULL,
    worker_id  text        NOT NULL,
    started_at timestamptz NOT NULL,
    ended_at   timestamptz NOT NULL DEFAULT now(),
    outcome    text        NOT NULL,
    error      text,
    warnings   jsonb       NOT NULL DEFAULT '[]',
    phases     jsonb,
    CONSTRAINT job_attempts_outcome_known
        CHECK (outcome IN ('done', 'retrying', 'failed', 'cancelled', 'released'))
);
CREATE INDEX job_attempts_job ON job_attempts (job_id, ended_at);

-- The attempt's phases are those the job row holds tagged with its number (0032): a tag of
-- another attempt was left by one that wrote none since.
CREATE FUNCTION jobs_record_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    outcome text := CASE
        WHEN NEW.status <> 'queued' THEN NEW.status
        WHEN NEW.attempts < OLD.attempts THEN 'released'
        ELSE 'retrying' END;
BEGIN
    INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error, warnings,
                              phases)
    VALUES (OLD.id, OLD.attempts, OLD.worker_id, OLD.started_at, outcome,
            CASE WHEN outcome IN ('failed', 'retrying') THEN NEW.error END,
            CASE WHEN outcome IN ('done', 'failed', 'retrying') THEN NEW.warnings
                 ELSE '[]'::jsonb END,
            CASE WHEN (NEW.attempt_phases->>'attempt')::int = OLD.attempts
                 THEN NEW.attempt_phases - 'attempt' END);
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_attempt_ended AFTER UPDATE OF status ON jobs
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status <> 'running')
    EXECUTE FUNCTION jobs_record_attempt();

-- The job as every API and transport shows it; events store it as it was at that moment. One
-- SELECT in SQL, STABLE: PostgreSQL inlines it into the statements that call it (every state
-- change), which their plans depend on.
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
        'channel', j.channel,
        'pages', j.pages,
        'bytes', j.bytes,
        'run_after', j.run_after,
        'created_at', j.created_at,
        'updated_at', j.updated_at,
        'started_at', j.started_at,
        'finished_at', j.finished_at,
        'trace_id', split_part(j.traceparent, '-', 2),
        'finishing', j.finishing,
        'provenance', j.provenance,
        'preflight', j.preflight,
        'cached_from', j.cached_from
    )
$$;

-- The render cache's lookup, for a job's insert and a batch's alike (insert_jobs,
-- insert_batch_jobs; 0037, 0039): a done job of the tenant with the same cache key, as a job
-- served from it is inserted: done, naming the job that rendered the file (cached_from), with
-- that file, its size, pages, provenance and finishing. No row for a miss, or for a job without
-- a key (STRICT: not even called). The done job is held (FOR KEY SHARE) until the caller
-- commits, so retention cannot delete its file meanwhile; one that retention holds is skipped (a
-- miss: rendered again). In PL/pgSQL for its plan, kept by each connection.
CREATE FUNCTION render_cache_hit(of_tenant text, of_key text)
RETURNS TABLE (cached_from uuid, status text, object_key text, bytes bigint, pages integer,
               provenance jsonb, finishing jsonb, progress integer, finished_at timestamptz)
LANGUAGE plpgsql VOLATILE STRICT AS $$
BEGIN
    RETURN QUERY
    SELECT coalesce(o.cached_from, o.id), 'done'::text, o.object_key, o.bytes, o.pages,
           o.provenance, o.finishing, 100, now()
    FROM jobs o
    WHERE o.tenant = of_tenant AND o.cache_key = of_key AND o.status = 'done'
    LIMIT 1
    FOR KEY SHARE OF o SKIP LOCKED;
END $$;


-- ---------------------------------------------------------------------------------------------
-- 2. The event log
-- ---------------------------------------------------------------------------------------------

-- One row per state change or progress step of a job (job.*), per step of a batch (batch.*,
-- naming no job, so that a job's own stream never carries them) and per template version
-- published (template.published, naming no job either; 0035); the payload is the job's, the
-- batch's or the version's public JSON at that moment. Every push transport reads it.
--
-- Event ids come from a sequence, so two transactions can commit in the opposite order of
-- their ids. Readers therefore order by (xid, id) and only read below the oldest running
-- transaction (pg_snapshot_xmin): that prefix of the log never changes again.
--
-- Partitioned by id in ranges that each fill for about a stretch of time, so that pruning
-- drops whole partitions (docs/decisions/008; 0017 tells why by id, not by time or xid). No
-- foreign key to jobs: a deleted job's events go with their partition.
CREATE TABLE job_events (
    id         bigserial   PRIMARY KEY,
    xid        xid8        NOT NULL DEFAULT pg_current_xact_id(),
    job_id     uuid,
    tenant     text        NOT NULL,
    type       text        NOT NULL,
    payload    jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT job_events_type_known CHECK (type IN (
        'job.queued', 'job.running', 'job.progress', 'job.retrying',
        'job.done', 'job.failed', 'job.cancelled', 'batch.progress', 'batch.done',
        'template.published')),
    CONSTRAINT job_events_subject
        CHECK ((job_id IS NULL) = (type LIKE 'batch.%' OR type LIKE 'template.%'))
) PARTITION BY RANGE (id);

CREATE INDEX job_events_position ON job_events (xid, id);
CREATE INDEX job_events_job ON job_events (job_id, xid, id);
-- A partition's newest event, and how far ids went in the last stretch (job_events_extend).
CREATE INDEX job_events_created ON job_events (created_at);
-- A channel's stream replays its events in log order. The channel is read from the payload:
-- no column to fill on the hot insert, and events without a channel are not in the index.
CREATE INDEX job_events_channel ON job_events (tenant, (payload->>'channel'), xid, id)
    WHERE payload->>'channel' IS NOT NULL;

-- The newest xid of each closed range (by its upper bound; NULL: it holds no event), written
-- once no writer can add to it again. A read after a cursor skips every range below the first
-- one that may hold an event at or past the cursor's xid (`floor` in server/events): by
-- position alone no range could be skipped, since ids do not follow log order.
CREATE TABLE job_events_sealed (
    hi         bigint PRIMARY KEY,
    newest_xid xid8
);

-- The next id the sequence hands out; every id handed out so far is below it.
CREATE FUNCTION job_events_next_id() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM job_events_id_seq
$$;

-- The range partitions, oldest first: lo NULL for one from MINVALUE (a log older than 0017).
CREATE FUNCTION job_events_ranges()
RETURNS TABLE (partition regclass, lo bigint, hi bigint) LANGUAGE sql STABLE AS $$
    SELECT c.oid::regclass,
           nullif(substring(b.bound FROM 'FROM \(''?([^'')]*)''?\) TO'), 'MINVALUE')::bigint,
           substring(b.bound FROM 'TO \(''?([^'')]*)''?\)')::bigint
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS bound) b
    WHERE i.inhparent = 'job_events'::regclass AND b.bound <> 'DEFAULT'
    ORDER BY 2 NULLS FIRST
$$;

-- Keeps the log ahead of its writers; returns how many partitions it made. After it:
-- - a partition whose oldest event is older than `stretch` is closed: the sequence moves on
--   to the next one, so that a quiet stretch is dropped in time too;
-- - the ranges reach past the next id by as many ids as the last `stretch` used, at least
--   `min_size`: partitions of that size are made until they do; after a burst that outran
--   them (its events in the overflow), the next range starts at the next id;
-- - every range below the next id is sealed (job_events_sealed).
-- Moving the sequence, making the range the writers are about to reach, or sealing one is
-- only safe while nobody inserts: for that it takes SHARE on the log, which waits for the
-- writers of the moment and holds new ones back until this one ends (0017 tells why). Reads
-- go on; and a range made well ahead of the writers needs no such lock.
CREATE FUNCTION job_events_extend(stretch interval, min_size bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    next_id bigint := job_events_next_id();
    top bigint;
    current regclass;
    current_hi bigint;
    oldest timestamptz;
    newest xid8;
    since bigint;
    size bigint;
    made integer := 0;
BEGIN
    SELECT e.id INTO since FROM job_events e
    WHERE e.created_at >= now() - stretch ORDER BY e.created_at LIMIT 1;
    size := greatest(min_size, next_id - coalesce(since, next_id));

    SELECT r.partition, r.hi INTO current, current_hi FROM job_events_ranges() r
    WHERE coalesce(r.lo, next_id) <= next_id AND next_id < r.hi;
    IF current IS NOT NULL THEN
        EXECUTE format('SELECT min(created_at) FROM %s', current) INTO oldest;
        IF oldest < now() - stretch THEN
            LOCK TABLE job_events IN SHARE MODE;
            IF job_events_next_id() < current_hi THEN
                PERFORM setval('job_events_id_seq', current_hi, false);
            END IF;
        END IF;
    END IF;

    next_id := job_events_next_id();
    SELECT max(hi) INTO top FROM job_events_ranges();
    IF top - next_id < min_size THEN
        LOCK TABLE job_events IN SHARE MODE;
        next_id := job_events_next_id();
        top := greatest(top, next_id);
    END IF;
    WHILE top - next_id < size LOOP
        PERFORM job_events_add_partition(top, top + size);
        top := top + size;
        made := made + 1;
    END LOOP;

    IF EXISTS (SELECT 1 FROM job_events_ranges() r
               WHERE r.hi <= next_id
                 AND NOT EXISTS (SELECT 1 FROM job_events_sealed s WHERE s.hi = r.hi)) THEN
        LOCK TABLE job_events IN SHARE MODE;
        next_id := job_events_next_id();
        FOR current, current_hi IN
            SELECT r.partition, r.hi FROM job_events_ranges() r
            WHERE r.hi <= next_id
              AND NOT EXISTS (SELECT 1 FROM job_events_sealed s WHERE s.hi = r.hi)
        LOOP
            EXECUTE format('SELECT max(xid) FROM %s', current) INTO newest;
            INSERT INTO job_events_sealed (hi, newest_xid) VALUES (current_hi, newest);
        END LOOP;
    END IF;
    RETURN made;
END $$;

CREATE FUNCTION job_events_add_partition(lo bigint, hi bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    name text := format('job_events_from_%s', lo);
BEGIN
    -- Made on its own, then attached: attaching lets reads and writes of the log go on (SHARE
    -- UPDATE EXCLUSIVE), where CREATE TABLE … PARTITION OF would stop them.
    EXECUTE format('CREATE TABLE %I (LIKE job_events INCLUDING CONSTRAINTS)', name);
    EXECUTE format('ALTER TABLE job_events ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)',
                   name, lo, hi);
END $$;

-- Whether every event of `part` is older than `keep` (none is, too).
CREATE FUNCTION job_events_expired(part regclass, keep interval) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    newest timestamptz;
BEGIN
    EXECUTE format('SELECT max(created_at) FROM %s', part) INTO newest;
    RETURN newest IS NULL OR newest < now() - keep;
END $$;

-- Drops every closed partition (below the next id) whose newest event is older than `keep`,
-- and empties the overflow once all of its events are; returns the partitions dropped: the
-- prune. Dropping takes the log's ACCESS EXCLUSIVE lock for a moment, the log first and then
-- the partition, in the order readers take theirs (else a reader and a drop could deadlock);
-- the caller bounds the wait (lock_timeout) and tries again at its next pass. What is dropped
-- is looked at again under that lock, when no writer is left that could still add to it.
CREATE FUNCTION job_events_drop_expired(keep interval) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    next_id bigint := job_events_next_id();
    r record;
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM job_events_ranges() x
        WHERE x.hi <= next_id AND job_events_expired(x.partition, keep)
    ) AND NOT (EXISTS (SELECT 1 FROM job_events_overflow)
               AND job_events_expired('job_events_overflow', keep)) THEN
        RETURN;
    END IF;
    LOCK TABLE job_events IN ACCESS EXCLUSIVE MODE;
    FOR r IN SELECT * FROM job_events_ranges() x
             WHERE x.hi <= next_id AND job_events_expired(x.partition, keep) LOOP
        RETURN NEXT r.partition::text;
        DELETE FROM job_events_sealed WHERE hi = r.hi;
        EXECUTE format('DROP TABLE %s', r.partition);
    END LOOP;
    IF EXISTS (SELECT 1 FROM job_events_overflow)
       AND job_events_expired('job_events_overflow', keep) THEN
        RETURN NEXT 'job_events_overflow';
        DROP TABLE job_events_overflow;
        CREATE TABLE job_events_overflow PARTITION OF job_events DEFAULT;
    END IF;
END $$;

-- The partitions a new database starts with: the first range, from the first id, sized as the
-- maintenance pass sizes them in a quiet log (server/queue/retention.py, which makes the next
-- ones); and the default partition, where rows past every range land (the pass fell behind a
-- burst), so that no insert ever fails at a boundary. A database older than 0017 has one more,
-- job_events_from_start below them: the log as it was then, with the names of that table's
-- indexes, until the prune drops it (0025 dropped it where it was empty).
SELECT job_events_add_partition(1, 10001);
CREATE TABLE job_events_overflow PARTITION OF job_events DEFAULT;

-- The hub's read (queries.sql, events_after_all, and events_after for what it does), in a
-- function for its plan alone. Run as a statement, PostgreSQL planned it afresh on every call:
-- a plan for the values given, partitions pruned, looks cheaper than the plan it could keep,
-- and planning a partitioned log costs several times what the read itself does
-- (docs/decisions/009-hub-read-keeps-its-plan.md). The kept plan prunes the partitions below
-- the floor ($4) as it starts, as well; so the function keeps it.
CREATE FUNCTION job_events_after_all(after_xid xid8, after_id bigint, page integer,
                                     floor_id bigint)
RETURNS TABLE (id bigint, xid bigint, job_id uuid, tenant text, type text, payload jsonb,
               created_at timestamptz, held boolean)
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT e.id, e.xid, e.job_id, e.tenant, e.type, e.payload, e.created_at, held.held
    FROM (SELECT (SELECT h.xid FROM job_events h WHERE h.id >= $4 ORDER BY h.xid DESC LIMIT 1)
                 >= pg_snapshot_xmin(pg_current_snapshot()) AS held) held
    LEFT JOIN LATERAL (
        SELECT e.id, e.xid::text::bigint AS xid, e.job_id, e.tenant, e.type, e.payload,
               e.created_at
        FROM job_events e
        WHERE (e.xid, e.id) > ($1, $2) AND e.id >= $4
          AND e.xid < pg_snapshot_xmin(pg_current_snapshot())
        ORDER BY e.xid, e.id
        LIMIT $3
    ) e ON true
    ORDER BY e.xid, e.id;
END $$;


-- ---------------------------------------------------------------------------------------------
-- 3. Templates
-- ---------------------------------------------------------------------------------------------

-- Named, versioned templates, so that clients send data only; `name@version` names one.
CREATE TABLE templates (
    tenant      text        NOT NULL,
    name        text        NOT NULL,
    version     integer     NOT NULL,
    -- Jinja2 HTML, or NULL for a Word template (`docx`).
    html        text,
    options     jsonb       NOT NULL DEFAULT '{}',
    sample_data jsonb       NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- The assets the version was stored with: {"img/logo.png": "sha256:…"}.
    assets      jsonb       NOT NULL DEFAULT '{}',
    -- A Word template's asset id (server/render/docx.py), or NULL for HTML (0031).
    docx        text,
    -- The JSON Schema (draft 2020-12) its jobs' data must meet, NULL for none; named data sets
    -- for its preview and the checks of publishing (0035).
    data_schema jsonb,
    samples     jsonb       NOT NULL DEFAULT '{}',
    -- NULL for a draft: the jobs naming the template without a version get its latest
    -- published version (0035; the versions stored before were published as they came).
    published_at timestamptz,
    PRIMARY KEY (tenant, name, version),
    -- No '@': `name@version` names one version in template_id.
    CONSTRAINT templates_name_format CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$'),
    CONSTRAINT templates_version_positive CHECK (version >= 1),
    CONSTRAINT templates_one_source CHECK ((html IS NULL) <> (docx IS NULL))
);

-- A version is immutable: jobs and people refer to `name@version` and must get what they saw.
-- Publishing a draft (setting published_at) is the one change allowed.
CREATE FUNCTION templates_refuse_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.published_at IS NULL
       AND to_jsonb(NEW) - 'published_at' = to_jsonb(OLD) - 'published_at' THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'template %@% is immutable; store a new version', OLD.name, OLD.version
        USING ERRCODE = 'check_violation';
END $$;

CREATE TRIGGER templates_immutable BEFORE UPDATE ON templates
    FOR EACH ROW EXECUTE FUNCTION templates_refuse_update();

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


-- ---------------------------------------------------------------------------------------------
-- 4. Batches and their combined PDFs
-- ---------------------------------------------------------------------------------------------

-- Many documents in one call, each item keyed by a stable business key.
CREATE TABLE batches (
    id           uuid        PRIMARY KEY,
    tenant       text        NOT NULL,
    -- The same request again (same items, same webhook) answers with this batch.
    request_hash text        NOT NULL,
    webhook_url  text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- Where the batch's latest event stands in the log (see batch_log_events).
    event_xid    xid8,
    channel      text        CONSTRAINT batches_channel_format CHECK (channel_valid(channel))
);
CREATE UNIQUE INDEX batches_request ON batches (tenant, request_hash);
-- A tenant's batches newest first, by cursor (GET /v1/batches, 0036).
CREATE INDEX batches_tenant_created ON batches (tenant, created_at DESC, id DESC);

-- A batch's items in order. A job may belong to several batches: a later batch naming an
-- accepted key reuses its job.
CREATE TABLE batch_items (
    batch_id uuid    NOT NULL REFERENCES batches (id) ON DELETE CASCADE,
    position integer NOT NULL,
    key      text    NOT NULL,
    job_id   uuid    NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    PRIMARY KEY (batch_id, position)
);
CREATE INDEX batch_items_job ON batch_items (job_id);

-- One PDF for a batch that asks (`combine`): once every item is done, the items' PDFs are
-- joined in item order into one file, stored like a job's. Its state:
--
--   waiting       some item is not final yet                         (shown as pending)
--   items_failed  every item is final, some failed or were cancelled (shown as failed)
--   pending       every item is done: due to be joined
--   running       a process holds it under a lease while it joins
--   done          the file is stored (object_key, pages, bytes)
--   failed        the join failed for good (error)
--
-- The items move it between waiting, items_failed and pending (batch_combine_follow, under the
-- batch's lock, before the batch's event is logged); a process claims a pending row, joins,
-- stores and marks it done, or puts it back to pending after a backoff; the rescuer takes
-- back one whose lease ran out. The batch is done only once its join is over.
CREATE TABLE batch_combines (
    batch_id         uuid        PRIMARY KEY REFERENCES batches (id) ON DELETE CASCADE,
    tenant           text        NOT NULL,
    -- One outline entry per item, titled with its key.
    outline          boolean     NOT NULL,
    status           text        NOT NULL DEFAULT 'waiting',
    attempts         integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL,
    run_after        timestamptz NOT NULL DEFAULT now(),
    worker_id        text,
    lease_expires_at timestamptz,
    error            text,
    object_key       text,
    pages            integer,
    bytes            bigint,
    started_at       timestamptz,
    finished_at      timestamptz,
    -- The combined file's signature (combine.sign, as requested); NULL: not signed (0034).
    sign             jsonb,
    CONSTRAINT batch_combines_status_known CHECK (status IN (
        'waiting', 'items_failed', 'pending', 'running', 'done', 'failed')),
    CONSTRAINT batch_combines_attempts_bounded
        CHECK (attempts >= 0 AND max_attempts >= 1 AND attempts <= max_attempts),
    CONSTRAINT batch_combines_running_has_lease
        CHECK ((status = 'running') = (lease_expires_at IS NOT NULL AND worker_id IS NOT NULL)),
    CONSTRAINT batch_combines_done_has_file
        CHECK ((status = 'done') = (object_key IS NOT NULL AND bytes IS NOT NULL)),
    CONSTRAINT batch_combines_finished_when_final
        CHECK ((status IN ('done', 'failed', 'items_failed')) = (finished_at IS NOT NULL))
);

-- The claim reads only due pending rows; the rescuer only running ones; retention by age.
CREATE INDEX batch_combines_due ON batch_combines (run_after, batch_id) WHERE status = 'pending';
CREATE INDEX batch_combines_lease ON batch_combines (lease_expires_at) WHERE status = 'running';
CREATE INDEX batch_combines_finished ON batch_combines (finished_at)
    WHERE finished_at IS NOT NULL;

CREATE FUNCTION batch_combines_check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status AND NOT (
           (OLD.status = 'waiting'      AND NEW.status IN ('pending', 'items_failed'))
        OR (OLD.status = 'items_failed' AND NEW.status IN ('waiting', 'pending'))
        OR (OLD.status = 'pending'      AND NEW.status = 'running')
        OR (OLD.status = 'running'      AND NEW.status IN ('pending', 'done', 'failed'))
    ) THEN
        RAISE EXCEPTION 'combined file of batch % cannot go from % to %',
            OLD.batch_id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER batch_combines_transition BEFORE UPDATE OF status ON batch_combines
    FOR EACH ROW EXECUTE FUNCTION batch_combines_check_transition();

-- The combined file as every API and transport shows it (its signed url is added when shown).
CREATE FUNCTION batch_combine_public(c batch_combines) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'status', CASE c.status WHEN 'waiting' THEN 'pending'
                                WHEN 'items_failed' THEN 'failed'
                                ELSE c.status END,
        'outline', c.outline,
        'signed', c.sign IS NOT NULL,
        'attempts', c.attempts,
        'error', c.error,
        'pages', c.pages,
        'bytes', c.bytes,
        'finished_at', c.finished_at
    )
$$;

-- A batch's public JSON as its items make it: counts of its jobs by state, done once every
-- item is final. batch_public adds the combined file; batch_log_events moves the combined file
-- on from these counts first.
CREATE FUNCTION batch_from_items(b batches) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', b.id,
        'status', CASE WHEN c.final = c.total THEN 'done' ELSE 'running' END,
        'total', c.total,
        'counts', jsonb_build_object(
            'queued', c.queued, 'running', c.running, 'done', c.done,
            'failed', c.failed, 'cancelled', c.cancelled),
        'progress', CASE WHEN c.total = 0 THEN 100 ELSE (100 * c.final) / c.total END,
        'webhook_url', b.webhook_url,
        'channel', b.channel,
        'created_at', b.created_at,
        'finished_at', CASE WHEN c.final = c.total THEN c.last_finished END
    )
    FROM (
        SELECT count(*) AS total,
               count(*) FILTER (WHERE j.status = 'queued') AS queued,
               count(*) FILTER (WHERE j.status = 'running') AS running,
               count(*) FILTER (WHERE j.status = 'done') AS done,
               count(*) FILTER (WHERE j.status = 'failed') AS failed,
               count(*) FILTER (WHERE j.status = 'cancelled') AS cancelled,
               count(*) FILTER (WHERE j.status IN ('done', 'failed', 'cancelled')) AS final,
               max(j.finished_at) AS last_finished
        FROM batch_items i JOIN jobs j ON j.id = i.job_id
        WHERE i.batch_id = b.id
    ) c
$$;

-- A batch's JSON from its items (`shown`) with its combined file `c` (a row of nulls for a
-- batch that did not ask: `combined` is null), and `status` done only once the join is over,
-- finished then.
CREATE FUNCTION batch_with_combined(shown jsonb, c batch_combines) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN c.batch_id IS NULL THEN shown || '{"combined": null}'::jsonb
        WHEN shown->>'status' = 'done' AND c.status NOT IN ('done', 'failed', 'items_failed')
            THEN shown || jsonb_build_object(
                'status', 'running', 'finished_at', NULL, 'combined', batch_combine_public(c))
        WHEN shown->>'status' = 'done'
            THEN shown || jsonb_build_object(
                'finished_at', greatest((shown->>'finished_at')::timestamptz, c.finished_at),
                'combined', batch_combine_public(c))
        ELSE shown || jsonb_build_object('combined', batch_combine_public(c))
    END
$$;

-- The batch as every API and transport shows it.
CREATE FUNCTION batch_public(b batches) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT batch_with_combined(batch_from_items(b),
                               (SELECT c FROM batch_combines c WHERE c.batch_id = b.id))
$$;

-- The items of a batch moved on (counts as batch_from_items shows them): its combined file `c`
-- waits, is due to be joined, or cannot be made; returned as it is now. Rows a process works
-- on (pending, running) and final ones are not the items' to move.
CREATE FUNCTION batch_combine_follow(c batch_combines, counts jsonb, total integer)
RETURNS batch_combines LANGUAGE plpgsql AS $$
DECLARE
    batch uuid := c.batch_id;
    next text;
    why text;
BEGIN
    IF c.status NOT IN ('waiting', 'items_failed') THEN
        RETURN c;
    END IF;
    next := CASE
        WHEN (counts->>'done')::integer = total THEN 'pending'
        WHEN (counts->>'done')::integer + (counts->>'failed')::integer
             + (counts->>'cancelled')::integer < total THEN 'waiting'
        ELSE 'items_failed' END;
    IF next = c.status THEN
        RETURN c;
    END IF;
    IF next = 'items_failed' THEN
        -- The first item that did not end done, by position, with its error; then how many
        -- others did not either.
        SELECT format('item %s %s%s', quote_literal(f.key),
                      CASE f.status WHEN 'cancelled' THEN 'was cancelled' ELSE 'failed' END,
                      coalesce(': ' || f.error, ''))
               || CASE WHEN f.others > 0
                       THEN format('; %s more items did not end done', f.others) ELSE '' END
        INTO why
        FROM (SELECT i.key, j.status, j.error, count(*) OVER () - 1 AS others
              FROM batch_items i JOIN jobs j ON j.id = i.job_id
              WHERE i.batch_id = batch AND j.status <> 'done'
              ORDER BY i.position
              LIMIT 1) f;
    END IF;
    UPDATE batch_combines
    SET status = next, error = why, run_after = now(),
        finished_at = CASE WHEN next = 'items_failed' THEN now() END
    WHERE batch_id = batch AND status = c.status
    RETURNING * INTO c;
    IF NOT FOUND THEN  -- moved meanwhile (nothing does, under the batch's lock): as it is
        SELECT * INTO c FROM batch_combines WHERE batch_id = batch;
    END IF;
    RETURN c;
END $$;

-- Log one event for each of these batches: batch.done once all of its jobs are final (and its
-- join is over), else batch.progress; its combined file is moved on first, so the event shows
-- where the join stands. Each batch row is locked (in id order, so two transactions cannot
-- deadlock) before its jobs are counted, so concurrent changes count in turn, each seeing
-- those committed before it. The log is read in (xid, id) order, but xids are handed out
-- before this lock is taken; so a batch event is placed at the greater of its own xid and that
-- of the batch's previous event, and the batch's events stay in the order they were counted:
-- progress never goes backwards and batch.done comes last. That is safe for readers, which
-- only read below the oldest running xid: this transaction's own xid is not past it until it
-- commits.
CREATE FUNCTION batch_log_events(ids uuid[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    b batches;
    c batch_combines;
    shown jsonb;
    at_xid xid8;
BEGIN
    FOR b IN SELECT * FROM batches WHERE id = ANY(ids) ORDER BY id FOR UPDATE LOOP
        shown := batch_from_items(b);
        SELECT * INTO c FROM batch_combines WHERE batch_id = b.id;
        IF FOUND THEN
            c := batch_combine_follow(c, shown->'counts', (shown->>'total')::integer);
        END IF;
        shown := batch_with_combined(shown, c);
        at_xid := greatest(pg_current_xact_id(), b.event_xid);
        INSERT INTO job_events (xid, job_id, tenant, type, payload)
        VALUES (at_xid, NULL, b.tenant,
                CASE shown->>'status' WHEN 'done' THEN 'batch.done' ELSE 'batch.progress' END,
                shown);
        UPDATE batches SET event_xid = at_xid WHERE id = b.id;
    END LOOP;
END $$;

-- What the join does to a row (every such change goes to or from running: the claim, its end,
-- a rescue, a release) logs the batch's event, whichever statement made it. The items' moves
-- are not logged here: batch_log_events makes them and logs the event itself.
CREATE FUNCTION batch_combines_after_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    moved uuid[];
BEGIN
    moved := ARRAY(
        SELECT n.batch_id FROM changed n JOIN unchanged o ON o.batch_id = n.batch_id
        WHERE n.status IS DISTINCT FROM o.status AND 'running' IN (n.status, o.status));
    IF cardinality(moved) > 0 THEN
        PERFORM batch_log_events(moved);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER batch_combines_events AFTER UPDATE ON batch_combines
    REFERENCING OLD TABLE AS unchanged NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION batch_combines_after_update();


-- ---------------------------------------------------------------------------------------------
-- 5. Webhooks
-- ---------------------------------------------------------------------------------------------

-- The webhook outbox: one row per delivered event (event_is_delivered) of a job or a batch
-- with a webhook_url, and per endpoint of a tenant (tenant_webhooks) for each of its own events
-- (template.published), written by the event triggers in the transaction of the change, so a
-- crash between the change and the POST loses nothing.
CREATE TABLE webhook_deliveries (
    -- Sent as the `webhook-id` header on every attempt, so receivers can de-duplicate.
    id               uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    job_id           uuid        REFERENCES jobs (id) ON DELETE CASCADE,
    tenant           text        NOT NULL,
    url              text        NOT NULL,
    type             text        NOT NULL,
    -- The job's (or batch's) public JSON at the moment of the change; links and the download
    -- URL are added at send time, so a retry hours later still carries a URL that works.
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
    -- Set for a batch's batch.done (a batch with combine); job_id for a job's final events;
    -- neither for a tenant's event (0040).
    batch_id         uuid        REFERENCES batches (id) ON DELETE CASCADE,
    CONSTRAINT webhook_deliveries_status_known
        CHECK (status IN ('pending', 'delivered', 'failed', 'disabled')),
    CONSTRAINT webhook_deliveries_delivered_at
        CHECK ((status = 'delivered') = (delivered_at IS NOT NULL)),
    CONSTRAINT webhook_deliveries_subject CHECK (
        num_nonnulls(job_id, batch_id) = CASE WHEN type LIKE 'template.%' THEN 0 ELSE 1 END),
    CONSTRAINT webhook_deliveries_type_known CHECK (type IN (
        'job.done', 'job.failed', 'job.cancelled', 'batch.done', 'template.published'))
);

-- The sender's claim reads only pending rows, earliest due first.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX webhook_deliveries_job ON webhook_deliveries (job_id, created_at);
CREATE INDEX webhook_deliveries_batch ON webhook_deliveries (batch_id, created_at)
    WHERE batch_id IS NOT NULL;
-- The event trigger's check for a URL that answered 410 Gone reads only the disabled rows,
-- whatever its plan: without it, a done write cost time in proportion to the outbox (0018,
-- docs/decisions/016).
CREATE INDEX webhook_deliveries_disabled ON webhook_deliveries (url) WHERE status = 'disabled';

-- Every attempt of a delivery, as it went.
CREATE TABLE webhook_attempts (
    delivery_id uuid        NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    attempt     integer     NOT NULL,
    status_code integer,
    duration_ms integer     NOT NULL,
    error       text,
    at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (delivery_id, attempt)
);

-- A webhook delivery as a job's story shows it (queries.sql: job_story, redeliver_webhook): its
-- state and every try.
CREATE FUNCTION webhook_delivery_story(w webhook_deliveries) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', w.id, 'type', w.type, 'url', w.url, 'status', w.status,
        'attempts', w.attempts, 'last_status_code', w.last_status_code,
        'last_error', w.last_error,
        'next_attempt_at', CASE WHEN w.status = 'pending' THEN w.next_attempt_at END,
        'created_at', w.created_at, 'delivered_at', w.delivered_at,
        'tries', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                         'attempt', t.attempt, 'status_code', t.status_code,
                         'duration_ms', t.duration_ms, 'error', t.error, 'at', t.at)
                         ORDER BY t.attempt), '[]'::jsonb)
                  FROM webhook_attempts t WHERE t.delivery_id = w.id))
$$;

-- A delivery due again (POST /v1/jobs/{id}/webhooks/{delivery_id}/redeliver) wakes every
-- process's sender, as a new one does (job_events_after_insert); no statement notifies itself.
CREATE FUNCTION webhook_deliveries_due_again() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pressroom_webhooks', 'w');
    RETURN NULL;
END $$;

CREATE TRIGGER webhook_deliveries_requeued AFTER UPDATE OF status ON webhook_deliveries
    FOR EACH ROW
    WHEN (OLD.status <> 'pending' AND NEW.status = 'pending')
    EXECUTE FUNCTION webhook_deliveries_due_again();

-- Whether an event is one the outbox delivers: a job's final event, or the batch.done of a
-- batch with combine; either with a webhook_url.
CREATE FUNCTION event_is_delivered(type text, payload jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT payload->>'webhook_url' IS NOT NULL AND (
        type IN ('job.done', 'job.failed', 'job.cancelled')
        OR (type = 'batch.done' AND jsonb_typeof(payload->'combined') = 'object'))
$$;


-- ---------------------------------------------------------------------------------------------
-- 6. The write path (docs/write-path.md)
-- ---------------------------------------------------------------------------------------------

-- A state change is one statement (queries.sql) that writes the change and its event rows.
-- What follows an event row is written here alone, after that statement and in its
-- transaction, so no statement can forget it (0010, docs/decisions/018):
-- - batch events: for each batch the statement's jobs belong to (batch_log_events); their own
--   insert comes back here one level deeper and notifies nothing, the statement that caused
--   them does. A batch event written on its own (batch_announce) notifies as any other.
-- - the webhook outbox: a row per delivered event, unless a delivery of that job or batch to
--   that URL was disabled (410 Gone); then one NOTIFY on pressroom_webhooks, payload 'w'. The
--   rows of a tenant's own events are job_events_tenant_webhooks' (below).
-- - NOTIFY on pressroom, payload '<kind>:<greatest event id of the statement>': kind 'q' when
--   some job of the statement was queued or retried, so the workers look for work (0023);
--   'e' otherwise.
-- PostgreSQL sends one notification per distinct payload per transaction, so a statement
-- sends one. One look at the rows first, so a statement does only the work its events call
-- for (an empty claim, the idle poll, none at all).
CREATE FUNCTION job_events_after_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    last_id bigint;
    queued boolean;
    batches_only boolean;
    hooks boolean;
BEGIN
    SELECT max(a.id),
           bool_or(a.type IN ('job.queued', 'job.retrying')),
           bool_and(a.job_id IS NULL),
           bool_or(event_is_delivered(a.type, a.payload))
    INTO last_id, queued, batches_only, hooks
    FROM added a;
    IF last_id IS NULL THEN
        RETURN NULL;
    END IF;

    IF NOT batches_only AND EXISTS (
        SELECT 1 FROM added a JOIN batch_items i ON i.job_id = a.job_id
        WHERE a.type LIKE 'job.%' AND a.type <> 'job.progress'
    ) THEN
        PERFORM batch_log_events(ARRAY(
            SELECT DISTINCT i.batch_id FROM added a JOIN batch_items i ON i.job_id = a.job_id
            WHERE a.type LIKE 'job.%' AND a.type <> 'job.progress'));
    END IF;

    IF hooks THEN
        WITH subject AS (
            SELECT a.*, CASE WHEN a.job_id IS NULL THEN (a.payload->>'id')::uuid END AS batch_id
            FROM added a
            WHERE event_is_delivered(a.type, a.payload)
        ), hook AS (
            INSERT INTO webhook_deliveries (job_id, batch_id, tenant, url, type, payload)
            SELECT s.job_id, s.batch_id, s.tenant, s.payload->>'webhook_url', s.type, s.payload
            FROM subject s
            WHERE NOT EXISTS (
                  SELECT 1 FROM webhook_deliveries w
                  WHERE (w.job_id = s.job_id OR w.batch_id = s.batch_id)
                    AND w.url = s.payload->>'webhook_url' AND w.status = 'disabled')
            RETURNING 1
        )
        SELECT count(*) > 0 INTO hooks FROM hook;
        IF hooks THEN
            PERFORM pg_notify('pressroom_webhooks', 'w');
        END IF;
    END IF;

    IF NOT (batches_only AND pg_trigger_depth() > 1) THEN
        PERFORM pg_notify('pressroom', CASE WHEN queued THEN 'q:' ELSE 'e:' END || last_id);
    END IF;
    RETURN NULL;
END $$;

-- On the partitioned table: a statement trigger on it sees in `added` the rows of every
-- partition the statement wrote to.
CREATE TRIGGER job_events_side_effects AFTER INSERT ON job_events
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION job_events_after_insert();

-- An event of the tenant as a whole (template.published, naming no job and no batch) goes to
-- each endpoint of the tenant that takes its type and is not disabled (tenant_webhooks), then
-- one NOTIFY on pressroom_webhooks, as above (0040). A row trigger whose WHEN only such events
-- pass: the statements of jobs and batches queue nothing and call nothing for it.
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

-- The write that makes jobs done (queries.sql, finish_done_many), in a function for its plan
-- alone, as job_events_after_all for the hub's read. Run as a statement, PostgreSQL planned it
-- afresh on every call, and planning it (eleven indexes on jobs, the log's partitions,
-- job_public inlined) cost more than running it. With sequential scans off while it is
-- planned, and the state compared with IS NOT DISTINCT FROM, which no index answers, the kept
-- plan finds each job by its primary key alone at any size of the table (0019, 0041,
-- docs/decisions/015).
-- Only the worker holding an attempt may finish it; a job already done with the attempt's own
-- file counts as finished (a retry of this write after its answer was lost). $8, each
-- attempt's phases, and $9 to $11, what finishing did, the provenance and what preflight found
-- (JSON text, 0038), may be left out (an older caller): the attempts keep none, the job's
-- reports stay as they were.
CREATE FUNCTION jobs_finish_done(uuid[], text, int[], text[], bigint[], int[], text[],
                                 text[] DEFAULT NULL, text[] DEFAULT NULL,
                                 text[] DEFAULT NULL, text[] DEFAULT NULL)
RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    RETURN QUERY
    WITH input AS (
        -- warnings, phases and the reports arrive as JSON text: a list of lists would be read
        -- as a 2-D array. Left out (an older caller), unnest pads their columns with NULLs.
        SELECT * FROM unnest($1, $3, $4, $5, $6, $7, $8, $9, $10, $11)
            AS t(id, attempt, object_key, bytes, pages, warnings, phases, finishing,
                 provenance, preflight)
    ), done AS (
        UPDATE jobs j
        SET status = 'done', object_key = i.object_key, bytes = i.bytes, pages = i.pages,
            warnings = i.warnings::jsonb, attempt_phases = i.phases::jsonb,
            finishing = coalesce(i.finishing::jsonb, j.finishing),
            provenance = coalesce(i.provenance::jsonb, j.provenance),
            preflight = coalesce(i.preflight::jsonb, j.preflight),
            progress = 100, error = NULL, lease_expires_at = NULL, worker_id = NULL,
            finished_at = now(), updated_at = now()
        FROM input i
        WHERE j.id = ANY ($1) AND j.id = i.id AND j.status IS NOT DISTINCT FROM 'running'
          AND j.worker_id = $2 AND j.attempts = i.attempt
        RETURNING j.*
    ), ev AS (
        INSERT INTO job_events (job_id, tenant, type, payload)
        SELECT d.id, d.tenant, 'job.done', job_public(d::jobs) FROM done d
    )
    SELECT d.id FROM done d
    UNION ALL
    SELECT j.id FROM jobs j JOIN input i ON j.id = i.id
    WHERE j.id = ANY ($1) AND j.status IS NOT DISTINCT FROM 'done'
      AND j.object_key = i.object_key;
END $$;


-- ---------------------------------------------------------------------------------------------
-- 7. Tenants and keys
-- ---------------------------------------------------------------------------------------------

-- Tenants name folders in storage (<tenant>/<job>/<attempt>.pdf): no slashes, no dots first.
-- Every query is scoped by tenant; another tenant's rows answer as unknown ones.

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
    CONSTRAINT api_keys_tenant_name
        CHECK (tenant ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$')
);

-- "Is any key active?" decides between dev mode and keyed mode.
CREATE INDEX api_keys_active ON api_keys (id) WHERE revoked_at IS NULL;
-- "Does this tenant have keys?" decides whether it gets a secret of its own.
CREATE INDEX api_keys_tenant ON api_keys (tenant);

-- One row per tenant that has API keys (written with its first key), holding its own secrets:
-- the webhook signing secret, and the secret its subscription tokens are signed with (HS256),
-- so that its backend can mint them without asking Pressroom. Tenants whose rows predate a
-- secret get it on first need. The open dev mode's tenant, which has no key, has no row and
-- signs webhooks with PRESSROOM_WEBHOOK_SECRET.
CREATE TABLE tenants (
    name                    text        PRIMARY KEY,
    webhook_secret          text        NOT NULL,
    -- After a rotation the old secret signs too, until rotated_at plus the overlap setting,
    -- so receivers can switch without dropping a delivery.
    previous_webhook_secret text,
    rotated_at              timestamptz,
    created_at              timestamptz NOT NULL DEFAULT now(),
    -- Rotating it invalidates every token signed with the old one.
    token_secret            text
        CONSTRAINT tenants_token_secret_format CHECK (token_secret LIKE 'prts\_%'),
    -- The render cache for every job of the tenant that does not say `cache: false`
    -- (`pressroom tenants cache`, 0039); every process keeps it in memory (server/web/defaults.py).
    render_cache            boolean     NOT NULL DEFAULT false,
    CONSTRAINT tenants_name
        CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$'),
    CONSTRAINT tenants_webhook_secret_format
        CHECK (webhook_secret LIKE 'whsec\_%'
               AND (previous_webhook_secret IS NULL OR previous_webhook_secret LIKE 'whsec\_%'))
);

-- The origins whose pages may call the API, the streams, the downloads and Socket.IO for one
-- tenant, beside PRESSROOM_CORS_ORIGINS (for every tenant). Each is written as a browser sends
-- it in Origin; every process keeps them all in memory and reads them again when a change is
-- announced (access_changed, below).
CREATE TABLE tenant_origins (
    tenant     text        NOT NULL REFERENCES tenants (name) ON DELETE CASCADE,
    origin     text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, origin)
);

-- Public keys that a tenant's backend signs subscription tokens with (RS256, ES256, EdDSA), so
-- that minting them needs no secret shared with Pressroom. A token names its key by the `kid`
-- of its header; a kid is unique per tenant, and so is a key (by its RFC 7638 thumbprint).
-- Removing a key refuses its tokens and closes the streams they opened.
CREATE TABLE tenant_token_keys (
    tenant     text        NOT NULL REFERENCES tenants (name) ON DELETE CASCADE,
    kid        text        NOT NULL,
    algorithm  text        NOT NULL,
    -- SubjectPublicKeyInfo PEM, as Pressroom wrote it out after checking it.
    public_key text        NOT NULL,
    thumbprint text        NOT NULL,
    added_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, kid),
    CONSTRAINT tenant_token_keys_one_kid_per_key UNIQUE (tenant, thumbprint),
    CONSTRAINT tenant_token_keys_kid_format CHECK (kid ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    CONSTRAINT tenant_token_keys_algorithm CHECK (algorithm IN ('RS256', 'ES256', 'EdDSA'))
);

-- A tenant's own webhook endpoints (`pressroom tenants webhooks`), each taking the types of the
-- tenant's events it lists, a CHECKed list that grows with them (server/events: TENANT_TYPES);
-- job_events_to_tenant_webhooks writes their deliveries. Disabled (disabled_at) by a delivery
-- answered 410 Gone: it gets nothing until it is added again (0040).
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

-- Every process keeps what it read of the keys, the tenants' token secrets and token keys and
-- their origins and render cache defaults in memory, and reads it again when told: a statement
-- that changes one of them notifies 'pressroom_access' (payload: the table) when its
-- transaction commits, so a new, revoked or removed key, a rotated secret, a changed origin or
-- default is in force on every process at once, and the streams that rested on what went are
-- closed (server/web/auth.py). Writes that change nothing of that (last_used_at, the webhook
-- secrets) notify nothing.
CREATE FUNCTION access_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pressroom_access', TG_TABLE_NAME);
    RETURN NULL;
END $$;

CREATE TRIGGER api_keys_changed AFTER INSERT OR DELETE OR UPDATE OF revoked_at ON api_keys
    FOR EACH STATEMENT EXECUTE FUNCTION access_changed();
CREATE TRIGGER tenants_changed
    AFTER INSERT OR DELETE OR UPDATE OF token_secret, render_cache ON tenants
    FOR EACH STATEMENT EXECUTE FUNCTION access_changed();
CREATE TRIGGER tenant_origins_changed AFTER INSERT OR DELETE OR UPDATE ON tenant_origins
    FOR EACH STATEMENT EXECUTE FUNCTION access_changed();
CREATE TRIGGER tenant_token_keys_changed AFTER INSERT OR DELETE OR UPDATE ON tenant_token_keys
    FOR EACH STATEMENT EXECUTE FUNCTION access_changed();


-- ---------------------------------------------------------------------------------------------
-- 8. Assets
-- ---------------------------------------------------------------------------------------------

-- Files a tenant uploads once (images, fonts, stylesheets, …) and jobs map in by relative
-- path. Content-addressed: the id is sha256:<hex> of the bytes, which live in the storage at
-- <tenant>/assets/<hex>; this row says they are there, and what they are. Deleting one looks
-- for the tenant's jobs in flight that use it (jobs_tenant_in_flight), so jobs.assets needs no
-- index of its own.
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
