-- The relay group's publication: what it publishes, and of which tables.
-- $1 the publication's name.
SELECT p.puballtables, p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate,
    coalesce((SELECT array_agg(t.schemaname || '.' || t.tablename ORDER BY 1) FROM pg_publication_tables t WHERE t.pubname = p.pubname), '{}')
FROM pg_publication p WHERE p.pubname = $1
