-- Changes to access are announced: a statement that adds, revokes or deletes an API key,
-- rotates a tenant's token secret, or changes its token keys or origins notifies
-- 'pressroom_access' (payload: the table) when it commits. Every process re-reads what it keeps
-- of them in memory then, instead of every PRESSROOM_AUTH_CACHE_S / 2 (that setting goes): a
-- first key closes dev mode, and a revocation takes effect, on every process at once.
--
-- Safe with jobs in flight: new function and triggers only, in one transaction. A process of
-- the previous release does not listen on the channel and keeps polling as before.
-- Every process keeps what it read of the keys, the tenants' token secrets and token keys and
-- their origins in memory, and reads it again when told: a statement that changes one of them
-- notifies 'pressroom_access' (payload: the table) when its transaction commits, so a new,
-- revoked or removed key, a rotated secret or a changed origin is in force on every process at
-- once, and the streams that rested on what went are closed (server/web/auth.py). Writes that
-- change nothing of that (last_used_at, the webhook secrets) notify nothing.
CREATE FUNCTION access_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pressroom_access', TG_TABLE_NAME);
    RETURN NULL;
END $$;

CREATE TRIGGER api_keys_changed AFTER INSERT OR DELETE OR UPDATE OF revoked_at ON api_keys
    FOR EACH STATEMENT EXECUTE FUNCTION access_changed();
CREATE TRIGGER tenants_changed AFTER INSERT OR DELETE OR UPDATE OF token_secret ON tenants
    FOR EACH STATEMENT EXECUTE FUNCTION access_changed();
CREATE TRIGGER tenant_origins_changed AFTER INSERT OR DELETE OR UPDATE ON tenant_origins
    FOR EACH STATEMENT EXECUTE FUNCTION access_changed();
CREATE TRIGGER tenant_token_keys_changed AFTER INSERT OR DELETE OR UPDATE ON tenant_token_keys
    FOR EACH STATEMENT EXECUTE FUNCTION access_changed();

