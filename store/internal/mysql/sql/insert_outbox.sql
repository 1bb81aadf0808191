-- One outbox row; the dialect repeats the VALUES tuple for each message of a Publish call.
-- ?1 uuid, ?2 topic, ?3 partition key (NULL for none), ?4 payload, ?5 metadata.
INSERT INTO {{schema}}.outbox (uuid, topic, partition_key, payload, metadata, created_at) VALUES
