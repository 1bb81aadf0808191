-- Everything unpublished, through the pending index; archived dead letters wait no more.
SELECT CAST(COALESCE(SUM(dead_lettered_at IS NULL), 0) AS SIGNED),
       MIN(CASE WHEN dead_lettered_at IS NULL THEN created_at END),
       CAST(COALESCE(SUM(dead_lettered_at IS NOT NULL AND archived_at IS NULL), 0) AS SIGNED),
       MIN(CASE WHEN archived_at IS NULL THEN dead_lettered_at END)
FROM {{schema}}.outbox
WHERE published_at IS NULL
