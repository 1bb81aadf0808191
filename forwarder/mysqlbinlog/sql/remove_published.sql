-- Removes published rows, in bulk, in the checkpoint's transaction. A dead letter stays. The
-- relay puts one placeholder per seq in the IN list.
DELETE FROM {{schema}}.outbox WHERE seq IN ({{seqs}}) AND dead_lettered_at IS NULL
