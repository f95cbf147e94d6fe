-- A job's source may be a Word template (`docx`: a .docx whose text carries Jinja, filled with
-- the job's data, then converted by LibreOffice; server/render/docx.py). Its `template` holds
-- the file's name, and `assets` the file under that name with the images its data places, so
-- DELETE /v1/assets keeps them while the job may still run.
--
-- A stored template's version is HTML (`html`) or a Word template (`docx`: its asset id),
-- exactly one of the two.
--
-- Safe with jobs in flight: older processes never insert the new source nor a version without
-- html (the new CHECKs read each table once, under the lock this transaction holds for that
-- moment); dropping NOT NULL and adding a nullable column change the catalog only.
ALTER TABLE jobs
    DROP CONSTRAINT jobs_source_known,
    ADD CONSTRAINT jobs_source_known
        CHECK (source IN ('template', 'markdown', 'page_url', 'office', 'pdfs', 'docx'));

ALTER TABLE templates
    ALTER COLUMN html DROP NOT NULL,
    ADD COLUMN docx text,
    ADD CONSTRAINT templates_one_source CHECK ((html IS NULL) <> (docx IS NULL));
