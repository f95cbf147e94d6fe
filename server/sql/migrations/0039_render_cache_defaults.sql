-- The render cache as a tenant's default, and for a batch's items (docs/documents.md, "Render
-- cache"). `tenants.render_cache`, set by `pressroom tenants cache TENANT --on | --off`, makes
-- every job of the tenant look the cache up unless it says `cache: false`; every process keeps
-- which tenants have it in memory (server/web/defaults.py) and reads it again when a change is
-- announced, so a change of it notifies pressroom_access as a rotated token secret does. The
-- lookup that insert_jobs held inline is render_cache_hit, so that insert_batch_jobs makes the
-- same one.
--
-- Safe with jobs in flight: a column with a constant default changes the catalog only, and
-- an older process inserts its tenants without it (false: no default, as before). The trigger
-- is dropped and made again in this one transaction, so no change goes unannounced. The
-- function is new; an older process's insert_jobs keeps its own lookup, which finds the same
-- rows.
ALTER TABLE tenants ADD COLUMN render_cache boolean NOT NULL DEFAULT false;

DROP TRIGGER tenants_changed ON tenants;
CREATE TRIGGER tenants_changed
    AFTER INSERT OR DELETE OR UPDATE OF token_secret, render_cache ON tenants
    FOR EACH STATEMENT EXECUTE FUNCTION access_changed();

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
