-- The PDF passwords of a job with options.encrypt, sealed with the server's secret
-- (server/passwords.py); its options show them as ***. job_public does not name this column,
-- so no route, stream or webhook can show it, and it is kept only while the job may still
-- run: a job's final state erases it, whichever statement sets it.
ALTER TABLE jobs ADD COLUMN passwords bytea;

CREATE FUNCTION jobs_erase_passwords() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.passwords := NULL;
    RETURN NEW;
END $$;

-- The condition is all a job without passwords pays: no function call.
CREATE TRIGGER jobs_passwords_erased BEFORE UPDATE ON jobs
    FOR EACH ROW
    WHEN (NEW.passwords IS NOT NULL AND NEW.status IN ('done', 'failed', 'cancelled'))
    EXECUTE FUNCTION jobs_erase_passwords();
