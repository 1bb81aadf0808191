-- The events of keys in the table, in seq order: read back when their keys may go again.
-- $1 the keys.
SELECT {{event_columns}}
FROM {{schema}}.outbox WHERE partition_key = ANY($1) AND published_at IS NULL AND dead_lettered_at IS NULL ORDER BY seq
