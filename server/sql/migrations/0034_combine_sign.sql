-- A batch's combined file may be signed (`combine.sign`): the signature's options, as the
-- request gave them, kept with the join that applies them; NULL: not signed. Shown on the
-- batch's JSON as combined.signed.
--
-- Safe with jobs in flight: a nullable column without a default changes the catalog only; an
-- older process inserts no sign and claims without reading it (a signed join it claims is
-- stored unsigned, as that process cannot sign one), and batch_combine_public is replaced in
-- place.
ALTER TABLE batch_combines ADD COLUMN sign jsonb;

CREATE OR REPLACE FUNCTION batch_combine_public(c batch_combines) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'status', CASE c.status WHEN 'waiting' THEN 'pending'
                                WHEN 'items_failed' THEN 'failed'
                                ELSE c.status END,
        'outline', c.outline,
        'signed', c.sign IS NOT NULL,
        'attempts', c.attempts,
        'error', c.error,
        'pages', c.pages,
        'bytes', c.bytes,
        'finished_at', c.finished_at
    )
$$;
