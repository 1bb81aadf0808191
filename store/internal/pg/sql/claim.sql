-- Claim the next rows to publish, holding their row locks until the pass commits.
--
-- The window is the oldest $2 due rows that nobody else has locked (SKIP LOCKED), so concurrent
-- relays take disjoint windows. A key's rows from its first row that must wait (one backing off,
-- or, when parking, a dead letter) are left out of it, so that a stuck key cannot fill the window
-- and starve the others. Then, per key, only the window rows before the key's first unpublished
-- row outside the window are kept: SKIP LOCKED leaves holes, and a row must never overtake an
-- earlier row of its key that someone else holds or that must wait. Rows without a key are always
-- kept.
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
    SELECT o.seq, o.partition_key
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
per_key AS (
    SELECT partition_key, array_agg(seq) AS seqs
    FROM win
    WHERE partition_key IS NOT NULL
    GROUP BY partition_key
),
kept AS (
    SELECT seq FROM win WHERE partition_key IS NULL
    UNION ALL
    -- Per key, the first unpublished row that is not in this window: a row locked by another relay,
    -- one that must wait, or one published by a pass not yet committed. The key's window rows from
    -- there on would overtake it, so they are dropped.
    SELECT s.seq
    FROM per_key AS k
    LEFT JOIN LATERAL (
        SELECT e.seq AS gap
        FROM {{schema}}.outbox AS e
        WHERE e.partition_key = k.partition_key
          AND e.published_at IS NULL
          -- (SELECT $3) is evaluated at run time: were $3 folded into the plan, "dead_lettered_at
          -- IS NULL" would make the pending index usable here, and with no statistics the planner
          -- may walk all pending rows once per key.
          AND (e.dead_lettered_at IS NULL OR (SELECT $3::bool))
          AND e.seq <> ALL (k.seqs)
        ORDER BY e.partition_key, e.seq
        LIMIT 1
    ) AS g ON true
    CROSS JOIN LATERAL unnest(k.seqs) AS s(seq)
    WHERE g.gap IS NULL OR s.seq < g.gap
)
SELECT o.seq, o.uuid, o.topic, o.partition_key, o.payload, o.metadata::text, o.created_at, o.attempts
FROM {{schema}}.outbox AS o
WHERE o.seq = ANY (ARRAY(SELECT seq FROM kept))
ORDER BY o.seq
