-- The window of a pass: the oldest ?3 due rows nobody else holds (SKIP LOCKED), leaving out a
-- key's rows from its first row that must wait (one backing off, or, when parking, a dead
-- letter), so that a stuck key cannot fill the window, and the rows of a paused topic (a relay
-- paused by name claims nothing). The subqueries read without locking.
-- ?1 now, ?2 park keys behind dead letters (0/1), ?3 window size, ?4 the relay's name.
SELECT o.seq, o.uuid, o.topic, COALESCE(o.partition_key, ''), o.payload, o.metadata, o.created_at, o.attempts
FROM {{schema}}.outbox AS o
WHERE o.published_at IS NULL
  AND o.dead_lettered_at IS NULL
  AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= ?1)
  AND NOT EXISTS (
      SELECT 1 FROM {{schema}}.outbox AS b
      WHERE b.partition_key = o.partition_key
        AND b.published_at IS NULL
        AND b.seq < o.seq
        AND ((b.dead_lettered_at IS NULL AND b.next_attempt_at > ?1) OR (?2 AND b.dead_lettered_at IS NOT NULL AND b.archived_at IS NULL))
  )
  AND NOT EXISTS (SELECT 1 FROM {{schema}}.pauses AS p WHERE p.scope = 'topic' AND p.name = o.topic)
  AND NOT EXISTS (SELECT 1 FROM {{schema}}.pauses AS p WHERE p.scope = 'relay' AND p.name = ?4)
ORDER BY o.seq
LIMIT ?3
FOR UPDATE SKIP LOCKED
