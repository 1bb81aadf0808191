-- The seq of the row a dead letter of the log was written as.
-- $1 its uuid.
SELECT seq FROM {{schema}}.outbox WHERE uuid = $1::uuid
