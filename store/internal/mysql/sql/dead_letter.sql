-- Dead-letter a message. A message dead-lettered again after a replay updates its row.
-- ?1 consumer, ?2 topic, ?3 message id, ?4 payload, ?5 metadata, ?6 reason, ?7 deliveries, ?8 now.
INSERT INTO {{schema}}.dead_letters
    (consumer, topic, message_id, payload, metadata, reason, deliveries, dead_lettered_at)
VALUES (?1, ?2, NULLIF(?3, ''), ?4, ?5, ?6, ?7, ?8)
ON DUPLICATE KEY UPDATE topic = VALUES(topic), payload = VALUES(payload), metadata = VALUES(metadata),
    reason = VALUES(reason), deliveries = VALUES(deliveries), dead_lettered_at = VALUES(dead_lettered_at),
    replayed_at = NULL
