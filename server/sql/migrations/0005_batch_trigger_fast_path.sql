-- Most statements that log job events touch no job in any batch. The batch-progress trigger
-- (0004) called batch_log_events for them anyway, with an empty list: a second function and a
-- locking query for nothing, about half again the cost of the insert itself. It now looks
-- first, with a join that finds nothing at the price of an index probe per event, and does
-- the batch work only when one of these jobs is in a batch. What it logs is unchanged.
CREATE OR REPLACE FUNCTION batch_events_after_job_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM added a JOIN batch_items i ON i.job_id = a.job_id
        WHERE a.type LIKE 'job.%' AND a.type <> 'job.progress'
    ) THEN
        PERFORM batch_log_events(ARRAY(
            SELECT DISTINCT i.batch_id FROM added a JOIN batch_items i ON i.job_id = a.job_id
            WHERE a.type LIKE 'job.%' AND a.type <> 'job.progress'));
    END IF;
    RETURN NULL;
END $$;
