-- A job's source may be an Office file (`office`: Word, Excel, PowerPoint, OpenDocument, RTF),
-- which LibreOffice converts (server/render/office.py). Its `template` holds the file's name,
-- and `assets` the file itself under that name, so DELETE /v1/assets keeps it while the job
-- may still run.
--
-- Safe with jobs in flight: older processes never insert the new source; the new CHECK reads
-- the table once, under the lock this transaction holds for that moment.
ALTER TABLE jobs
    DROP CONSTRAINT jobs_source_known,
    ADD CONSTRAINT jobs_source_known
        CHECK (source IN ('template', 'markdown', 'page_url', 'office'));
