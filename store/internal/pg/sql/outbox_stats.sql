-- Pending rows through the pending index (the oldest is the first in seq order), dead letters
-- through the dead-letter index; archived dead letters wait no more.
SELECT (SELECT count(*) FROM {{schema}}.outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL),
       (SELECT created_at FROM {{schema}}.outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL
        ORDER BY seq LIMIT 1),
       (SELECT count(*) FROM {{schema}}.outbox WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL AND archived_at IS NULL),
       (SELECT min(dead_lettered_at) FROM {{schema}}.outbox
        WHERE dead_lettered_at IS NOT NULL AND published_at IS NULL AND archived_at IS NULL)
