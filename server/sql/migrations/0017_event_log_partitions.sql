-- The event log is partitioned, so that pruning it drops whole partitions instead of deleting
-- rows one by one (a DELETE leaves every row behind for vacuum: several million a day at a
-- million jobs a day).
--
-- The key is the event id, in ranges, each filled for about a stretch of time:
-- - the primary key stays (id): a unique key of a partitioned table must hold its partition
--   key, so by time or by xid it would become (id, created_at) or (xid, id), and moving the
--   existing log would build it again over every row under this migration's lock; by id the
--   existing table becomes the first partition as it is, its indexes included;
-- - a client's cursor is an event id: event_position (Last-Event-ID → position) reads one
--   partition, not all of them;
-- - ids come from one sequence that only event inserts use, so the log's pass
--   (server/retention.py, job_events_extend below) sizes the partitions it makes ahead by how
--   many ids the last stretch used, and closes one that has filled for longer than a stretch
--   by moving the sequence on to the next partition (ids then skip, by less than a stretch's
--   worth; a cursor only ever compares them).
-- Reads by position, (xid, id) > cursor, are not pruned by that: an event may have a smaller
-- id than one before it in log order (two transactions committing in the opposite order of
-- their ids). So the pass seals each range once closed, writing down its newest xid, and a
-- read is also given the id below which no event can be at or past its cursor's xid (the first
-- range not sealed or whose newest xid reaches the cursor's, events.py): the hub at the head
-- reads the newest partition (and the overflow), not all of them, and PostgreSQL plans only
-- those. By created_at, reads would ask every partition, the cursor's lookup included, and the
-- primary key would grow. By xid, reads would prune without help, but xids are the whole
-- cluster's and cannot be moved on: partitions could neither be sized ahead of the writers nor
-- closed when a quiet stretch runs long.
--
-- Rows past every range (the maintenance pass fell behind a burst) land in the default
-- partition, job_events_overflow, so no insert ever fails at a boundary; the next pass starts
-- the next range after them. A partition is dropped once its newest event is older than the
-- log keeps events; that is the prune.
--
-- Retention no longer deletes a job's events with the job: the foreign key to jobs goes, and
-- with it the DELETE per event that its ON DELETE CASCADE cost (and the check per insert).
-- The log keeps events no longer than retention keeps jobs (server/maintenance.py), so a
-- deleted job's events go with their partition, at most a stretch later.
--
-- The migration runs in one transaction (server/db.py) holding the log's lock: no event is
-- written while the table changes shape, and each existing event keeps its id and xid, so a
-- cursor taken before it resumes after it with nothing missed or repeated.

LOCK TABLE job_events IN ACCESS EXCLUSIVE MODE;

-- The existing log becomes the first partition, its name and its indexes' names freed.
ALTER TABLE job_events RENAME TO job_events_from_start;
ALTER INDEX job_events_pkey RENAME TO job_events_from_start_pkey;
ALTER INDEX job_events_position RENAME TO job_events_from_start_position;
ALTER INDEX job_events_job RENAME TO job_events_from_start_job;
ALTER INDEX job_events_created RENAME TO job_events_from_start_created;
ALTER INDEX job_events_channel RENAME TO job_events_from_start_channel;
DROP TRIGGER job_events_side_effects ON job_events_from_start;
ALTER TABLE job_events_from_start DROP CONSTRAINT job_events_job_id_fkey;
ALTER TABLE job_events_from_start ALTER COLUMN id DROP DEFAULT;

-- Event ids come from a sequence, so two transactions can commit in the opposite order of
-- their ids. Readers therefore order by (xid, id) and only read below the oldest running
-- transaction (pg_snapshot_xmin): that prefix of the log never changes again (0001).
CREATE TABLE job_events (
    id         bigint      NOT NULL DEFAULT nextval('job_events_id_seq'),
    xid        xid8        NOT NULL DEFAULT pg_current_xact_id(),
    job_id     uuid,
    tenant     text        NOT NULL,
    type       text        NOT NULL,
    payload    jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT job_events_pkey PRIMARY KEY (id),
    CONSTRAINT job_events_type_known CHECK (type IN (
        'job.queued', 'job.running', 'job.progress', 'job.retrying',
        'job.done', 'job.failed', 'job.cancelled', 'batch.progress', 'batch.done')),
    CONSTRAINT job_events_subject CHECK ((job_id IS NULL) = (type LIKE 'batch.%'))
) PARTITION BY RANGE (id);
ALTER SEQUENCE job_events_id_seq OWNED BY job_events.id;

CREATE INDEX job_events_position ON job_events (xid, id);
CREATE INDEX job_events_job ON job_events (job_id, xid, id);
-- A partition's newest event, and how far ids went in the last stretch (job_events_extend).
CREATE INDEX job_events_created ON job_events (created_at);
CREATE INDEX job_events_channel ON job_events (tenant, (payload->>'channel'), xid, id)
    WHERE payload->>'channel' IS NOT NULL;

-- The next id the sequence hands out; every id handed out so far is below it.
CREATE FUNCTION job_events_next_id() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM job_events_id_seq
$$;

-- Every existing event, and every id handed out and not yet written, is below the next id.
DO $$
BEGIN
    EXECUTE format(
        'ALTER TABLE job_events ATTACH PARTITION job_events_from_start '
        'FOR VALUES FROM (MINVALUE) TO (%s)', job_events_next_id());
END $$;

CREATE TABLE job_events_overflow PARTITION OF job_events DEFAULT;

-- The range partitions, oldest first: lo NULL for the first (from MINVALUE).
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

-- The newest xid of each closed range (by its upper bound; NULL: it holds no event), written
-- once no writer can add to it again. A read after a cursor skips every range below the first
-- one that may hold an event at or past the cursor's xid (events.py): by position alone no
-- range could be skipped, since ids do not follow log order.
CREATE TABLE job_events_sealed (
    hi         bigint PRIMARY KEY,
    newest_xid xid8
);

-- Keeps the log ahead of its writers; returns how many partitions it made. After it:
-- - a partition whose oldest event is older than `stretch` is closed: the sequence moves on
--   to the next one, so that a quiet stretch is dropped in time too;
-- - the ranges reach past the next id by as many ids as the last `stretch` used, at least
--   `min_size`: partitions of that size are made until they do; after a burst that outran
--   them (its events in the overflow), the next range starts at the next id;
-- - every range below the next id is sealed (job_events_sealed).
-- Moving the sequence, making the range the writers are about to reach, or sealing one is
-- only safe while nobody inserts (a value handed out meanwhile could be handed out again, land
-- in the overflow and stop the range from being attached, or be written to a range after its
-- newest xid was taken): for that it takes SHARE on the log, which waits for the writers of
-- the moment (every id is handed out within an INSERT into the log, which holds the log's
-- ROW EXCLUSIVE until its transaction ends) and holds new ones back until this one ends.
-- Reads go on; and a range made well ahead of the writers needs no such lock.
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
-- and empties the overflow once all of its events are; returns the partitions dropped.
-- Dropping takes the log's ACCESS EXCLUSIVE lock for a moment, the log first and then the
-- partition, in the order readers take theirs (else a reader and a drop could deadlock); the
-- caller bounds the wait (lock_timeout) and tries again at its next pass. What is dropped is
-- looked at again under that lock, when no writer is left that could still add to it.
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

-- The hub's read (queries.sql, events_after_all, and events_after for what it does), in a
-- function for its plan alone. Run as a statement, PostgreSQL planned it afresh on every call:
-- a plan for the values given, partitions pruned, looks cheaper than the plan it could keep,
-- and planning a partitioned log costs several times what the read itself does
-- (docs/benchmarks-by-hand.md, "Event-log prune"). The kept plan prunes the partitions below the
-- floor ($4) as it starts, as well; so the function keeps it.
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

-- The first partition past the existing log, sized by how far ids went in the last day.
SELECT job_events_extend(interval '1 day', 10000);

-- 0010/0016's trigger, on the partitioned table: a statement trigger on it sees in `added`
-- the rows of every partition the statement wrote to.
CREATE TRIGGER job_events_side_effects AFTER INSERT ON job_events
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION job_events_after_insert();
