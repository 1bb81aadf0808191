-- Everything unpublished, through the partial index on unpublished rows.
SELECT count(*) FILTER (WHERE dead_lettered_at IS NULL),
       min(created_at) FILTER (WHERE dead_lettered_at IS NULL),
       count(*) FILTER (WHERE dead_lettered_at IS NOT NULL),
       min(dead_lettered_at) FILTER (WHERE dead_lettered_at IS NOT NULL)
FROM {{schema}}.outbox
WHERE published_at IS NULL
