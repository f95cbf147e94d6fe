-- A new database no longer starts with an event log partition that can never hold an event.
-- 0017 made the log as it was then the first partition, job_events_from_start, from MINVALUE
-- up to the next id; in a database made since, that log was empty, so the partition is empty
-- and below every id from the start, and the first maintenance pass dropped it, reporting at
-- every new install a prune of events that never were. It goes here, with its seal, before any
-- event is written; a first partition that holds events (a log older than 0017) is the
-- prune's, as before.
--
-- Safe with jobs in flight: where the partition holds events, or is gone already, this changes
-- nothing; else it takes the log's lock for the moment a drop takes, as a prune does.
DO $$
DECLARE
    closed_at bigint;
BEGIN
    SELECT r.hi INTO closed_at FROM job_events_ranges() r
    WHERE r.partition = to_regclass('job_events_from_start');
    IF closed_at IS NULL OR closed_at > job_events_next_id() THEN
        RETURN;
    END IF;
    LOCK TABLE job_events IN ACCESS EXCLUSIVE MODE;
    IF EXISTS (SELECT 1 FROM job_events_from_start) THEN
        RETURN;
    END IF;
    DELETE FROM job_events_sealed WHERE hi = closed_at;
    DROP TABLE job_events_from_start;
END $$;
