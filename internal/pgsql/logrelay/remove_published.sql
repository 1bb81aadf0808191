-- Removes published rows again, once their writers' commits are visible.
-- $1 their uuids.
DELETE FROM {{schema}}.outbox WHERE uuid = ANY($1::uuid[]) AND dead_lettered_at IS NULL
