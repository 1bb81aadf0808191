-- Claim the next rows to publish, holding their row locks until the pass commits.
--
-- The window is the oldest $2 due rows that nobody else has locked (SKIP LOCKED), so concurrent
-- relays take disjoint windows. A key's rows from its first row that must wait (one backing off,
-- or, when parking, a dead letter) are left out of it, so that a stuck key cannot fill the window
-- and starve the others. Then, per key, only the window rows before the key's first unpublished
-- row outside the window are kept: SKIP LOCKED leaves holes, and a row must never overtake an
-- earlier row of its key that someone else holds or that must wait. Rows without a key are always
-- kept. Every step reads the pending index (or the small backing-off and dead-letter ones), so
-- the claim costs the same with 0 or 5 M published rows behind it.
--
-- Rows of a paused topic are left out of the window (they stay pending: gaps for their keys), and
-- a relay paused by name claims nothing.
--
-- $1 now, $2 window size, $3 park keys behind dead-lettered rows, $4 the relay's name.
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
          AND d.archived_at IS NULL
          AND d.partition_key IS NOT NULL
    ) AS waiting
    GROUP BY partition_key
),
win AS (
    SELECT o.seq, o.partition_key
    FROM {{schema}}.outbox AS o
    WHERE o.published_at IS NULL
      AND o.dead_lettered_at IS NULL
      AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= $1)
      AND NOT EXISTS (
          SELECT 1 FROM blocked
          WHERE blocked.partition_key = o.partition_key AND o.seq >= blocked.from_seq
      )
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.pauses AS p WHERE p.scope = 'topic' AND p.name = o.topic)
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.pauses AS p WHERE p.scope = 'relay' AND p.name = $4::text)
    ORDER BY o.seq
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
gaps AS MATERIALIZED (
    -- Per key of the window, its earliest unpublished row below the window's last row that is not
    -- in the window: a row locked by another relay, one that must wait, or one published by a pass
    -- not yet committed. One range scan of the pending index, bounded by the window's last seq, so
    -- it reads the window and what other relays hold, never the backlog behind it. (A key's
    -- dead-lettered rows, when parking, are left out of the window by blocked already.)
    SELECT e.partition_key, min(e.seq) AS gap
    FROM {{schema}}.outbox AS e
    WHERE e.published_at IS NULL
      AND e.dead_lettered_at IS NULL
      AND e.seq < (SELECT max(w.seq) FROM win AS w)
      AND e.partition_key IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM win AS w WHERE w.seq = e.seq)
    GROUP BY e.partition_key
),
kept AS (
    -- A window row stays unless an earlier row of its key is a gap: it would overtake it. Rows
    -- without a key are always kept.
    SELECT w.seq
    FROM win AS w
    WHERE w.partition_key IS NULL
       OR NOT EXISTS (SELECT 1 FROM gaps AS g WHERE g.partition_key = w.partition_key AND g.gap < w.seq)
)
SELECT o.seq, coalesce(o.uuid_text, o.uuid::text), o.topic, o.partition_key, o.payload, o.metadata, o.created_at, o.attempts
FROM {{schema}}.outbox AS o
WHERE o.seq = ANY (ARRAY(SELECT seq FROM kept))
  AND o.published_at IS NULL
  AND o.dead_lettered_at IS NULL
ORDER BY o.seq
