-- The next rows of a backfill: the events left in the table, in seq order.
-- $1 the last seq read (0 to begin), $2 the most rows to read.
SELECT {{event_columns}}
FROM {{schema}}.outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL AND seq > $1 ORDER BY seq LIMIT $2
