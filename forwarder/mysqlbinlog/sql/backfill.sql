-- A page of the rows waiting in the outbox, for the first start (the log holds no earlier rows
-- for the relay). The locking read waits for a writer whose commit is in the binary log but not
-- yet visible, so that every row committed before the position read is in a page or in the log.
-- ?1 the last seq read, ?2 the page's size.
SELECT seq, uuid, topic, COALESCE(partition_key, ''), payload, metadata, created_at, attempts, next_attempt_at
FROM {{schema}}.outbox
WHERE published_at IS NULL AND dead_lettered_at IS NULL AND seq > ?
ORDER BY seq
LIMIT ?
LOCK IN SHARE MODE
