-- Everything unpublished, through the pending index.
SELECT CAST(COALESCE(SUM(dead_lettered_at IS NULL), 0) AS SIGNED),
       MIN(CASE WHEN dead_lettered_at IS NULL THEN created_at END),
       CAST(COALESCE(SUM(dead_lettered_at IS NOT NULL), 0) AS SIGNED),
       MIN(dead_lettered_at)
FROM {{schema}}.outbox
WHERE published_at IS NULL
