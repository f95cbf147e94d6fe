-- Public keys that a tenant's backend signs subscription tokens with (RS256, ES256, EdDSA), so
-- that minting them needs no secret shared with Pressroom. A token names its key by the `kid`
-- of its header; a kid is unique per tenant, and so is a key (by its RFC 7638 thumbprint).
-- Removing a key refuses its tokens and closes the streams they opened (server/auth.py).

CREATE TABLE tenant_token_keys (
    tenant     text        NOT NULL REFERENCES tenants (name) ON DELETE CASCADE,
    kid        text        NOT NULL,
    algorithm  text        NOT NULL,
    -- SubjectPublicKeyInfo PEM, as server/token_keys.py wrote it out after checking it.
    public_key text        NOT NULL,
    thumbprint text        NOT NULL,
    added_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, kid),
    CONSTRAINT tenant_token_keys_one_kid_per_key UNIQUE (tenant, thumbprint),
    CONSTRAINT tenant_token_keys_kid_format CHECK (kid ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    CONSTRAINT tenant_token_keys_algorithm CHECK (algorithm IN ('RS256', 'ES256', 'EdDSA'))
);
