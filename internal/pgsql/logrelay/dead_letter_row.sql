-- Dead-letters an outbox row the relay read.
-- $1 its uuid, $2 its attempts, $3 the last error, $4 the time.
UPDATE {{schema}}.outbox SET attempts = $2, last_error = $3, dead_lettered_at = $4
WHERE uuid = $1::uuid AND published_at IS NULL
