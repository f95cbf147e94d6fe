-- A template version may carry a data contract: `data_schema`, a JSON Schema (draft 2020-12)
-- that the data of its jobs must meet at submission (NULL: none, as before), and `samples`,
-- named data sets ({"paid": {...}, "long": {...}}) that its preview and the checks of
-- publishing render.
--
-- Safe with jobs in flight: nullable columns and a constant default change the catalog only;
-- older processes never read them.
ALTER TABLE templates
    ADD COLUMN data_schema jsonb,
    ADD COLUMN samples jsonb NOT NULL DEFAULT '{}';
