-- The outbox with its message id as the inbox and the dead letters name it: message_id, text. The
-- outbox keys rows by a 16-byte uuid (and keeps an id that is not a canonical UUID in uuid_text),
-- while inbox.message_id and dead_letters.message_id are text (they also hold ids other producers
-- chose), so a join of the outbox on them needs this cast; the view makes it once, and the same
-- operator's SQL — JOIN inbox i ON i.message_id = o.message_id — runs on every database.
CREATE VIEW {{schema}}.outbox_messages AS
SELECT seq, coalesce(uuid_text, uuid::text) AS message_id, topic, partition_key, payload, metadata,
       created_at, published_at, attempts, next_attempt_at, dead_lettered_at, last_error
FROM {{schema}}.outbox;
