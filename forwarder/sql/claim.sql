-- Claim the next rows to publish, holding their row locks until the pass commits.
--
-- The window is the oldest $2 due rows that nobody else has locked (SKIP LOCKED), so concurrent
-- relays take disjoint windows. A key's rows from its first row that must wait (one backing off,
-- or, when parking, a dead letter) are left out of it, so that a stuck key cannot fill the window
-- and starve the others. Then a key is kept only if its first row in the window is the key's first unpublished
-- row: otherwise an earlier row is still waiting elsewhere (locked by another relay, or published
-- by a pass not yet committed) and the whole key waits for a later pass. Rows without a key are
-- always kept.
--
-- $1 now, $2 window size, $3 park keys behind dead-lettered rows.
WITH blocked AS (
    -- Per key, the first row that must wait; the key's rows from there on are left out.
    SELECT partition_key, min(seq) AS from_seq
    FROM (
        SELECT b.partition_key, b.seq
        FROM {{schema}}.outbox AS b
        WHERE b.published_at IS NULL
          AND b.dead_lettered_at IS NULL
          AND b.next_attempt_at > $1
          AND b.partition_key IS NOT NULL
        UNION ALL
        SELECT d.partition_key, d.seq
        FROM {{schema}}.outbox AS d
        WHERE $3
          AND d.dead_lettered_at IS NOT NULL
          AND d.published_at IS NULL
          AND d.partition_key IS NOT NULL
    ) AS waiting
    GROUP BY partition_key
),
win AS (
    SELECT o.seq, o.uuid, o.topic, o.partition_key, o.payload, o.metadata, o.created_at, o.attempts
    FROM {{schema}}.outbox AS o
    WHERE o.published_at IS NULL
      AND o.dead_lettered_at IS NULL
      AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= $1)
      AND NOT EXISTS (
          SELECT 1 FROM blocked
          WHERE blocked.partition_key = o.partition_key AND o.seq >= blocked.from_seq
      )
    ORDER BY o.seq
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
firsts AS (
    SELECT partition_key, min(seq) AS seq
    FROM win
    WHERE partition_key IS NOT NULL
    GROUP BY partition_key
),
behind AS (
    SELECT f.partition_key
    FROM firsts AS f
    WHERE EXISTS (
        SELECT 1
        FROM {{schema}}.outbox AS e
        WHERE e.partition_key = f.partition_key
          AND e.seq < f.seq
          AND e.published_at IS NULL
          AND (e.dead_lettered_at IS NULL OR $3)
    )
)
SELECT w.seq, w.uuid, w.topic, w.partition_key, w.payload, w.metadata::text, w.created_at, w.attempts
FROM win AS w
WHERE w.partition_key IS NULL
   OR NOT EXISTS (SELECT 1 FROM behind WHERE behind.partition_key = w.partition_key)
ORDER BY w.seq
