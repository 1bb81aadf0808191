-- Lease the window of a pass: the oldest ?5 due rows no live lease holds, leaving out a key's rows
-- from its first row that must wait (one backing off, or, when parking, a dead letter), so that a
-- stuck key cannot fill the window, and the rows of a paused topic (a relay paused by name claims
-- nothing). ?1 owner, ?2 lease until, ?3 now, ?4 park (0/1), ?5 window size, ?6 the relay's name.
UPDATE {{schema}}.outbox
SET lease_owner = ?1, lease_until = ?2
WHERE seq IN (
    SELECT o.seq
    FROM {{schema}}.outbox AS o
    WHERE o.published_at IS NULL
      AND o.dead_lettered_at IS NULL
      AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= ?3)
      AND (o.lease_until IS NULL OR o.lease_until < ?3)
      AND NOT EXISTS (
          SELECT 1 FROM {{schema}}.outbox AS b
          WHERE b.partition_key = o.partition_key
            AND b.published_at IS NULL
            AND b.seq < o.seq
            AND ((b.dead_lettered_at IS NULL AND b.next_attempt_at > ?3) OR (?4 AND b.dead_lettered_at IS NOT NULL AND b.archived_at IS NULL))
      )
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.pauses AS p WHERE p.scope = 'topic' AND p.name = o.topic)
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.pauses AS p WHERE p.scope = 'relay' AND p.name = ?6)
    ORDER BY o.seq
    LIMIT ?5
)
RETURNING seq, uuid, topic, COALESCE(partition_key, ''), payload, metadata, created_at, attempts
