-- The outbox with its message id as the inbox and the dead letters name it (message_id), so that
-- an operator's join — JOIN inbox i ON i.message_id = o.message_id — is the same SQL on every
-- database (Postgres keys the outbox by a uuid column and needs a cast there).
CREATE VIEW IF NOT EXISTS {{schema}}.outbox_messages AS
SELECT seq, uuid AS message_id, topic, partition_key, payload, metadata,
       created_at, published_at, attempts, next_attempt_at, dead_lettered_at, last_error
FROM {{schema}}.outbox;
