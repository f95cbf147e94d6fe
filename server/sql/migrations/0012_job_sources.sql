-- A job's source is a template (as before), Markdown, or a page URL. `template` holds the
-- source's text: the Jinja2 HTML, the Jinja2 Markdown, or the page's URL.
ALTER TABLE jobs
    ADD COLUMN source text NOT NULL DEFAULT 'template',
    ADD CONSTRAINT jobs_source_known CHECK (source IN ('template', 'markdown', 'page_url'));

-- The cookie and header values of a page_url job, sealed with the server's secret
-- (server/vault.py); its options show them as ***. job_public does not name this column, so
-- no route, stream or webhook can show it, and it is kept only while the job may still run:
-- a job's final state erases it, whichever statement sets it.
ALTER TABLE jobs ADD COLUMN secrets bytea;

CREATE FUNCTION jobs_erase_secrets() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.secrets := NULL;
    RETURN NEW;
END $$;

-- The condition is all a job without secrets pays: no function call.
CREATE TRIGGER jobs_secrets_erased BEFORE UPDATE ON jobs
    FOR EACH ROW
    WHEN (NEW.secrets IS NOT NULL AND NEW.status IN ('done', 'failed', 'cancelled'))
    EXECUTE FUNCTION jobs_erase_secrets();
