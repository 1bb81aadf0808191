-- Everything unpublished, through the pending index.
SELECT COALESCE(SUM(dead_lettered_at IS NULL), 0),
       MIN(CASE WHEN dead_lettered_at IS NULL THEN created_at END),
       COALESCE(SUM(dead_lettered_at IS NOT NULL), 0),
       MIN(dead_lettered_at)
FROM {{schema}}.outbox
WHERE published_at IS NULL
