-- Claim the next rows to publish, holding their row locks until the pass commits.
--
-- A head is the first unpublished row of its partition key (every row without a key is its own
-- head) that is due. Heads are locked with SKIP LOCKED, so concurrent relays take disjoint keys:
-- whoever holds a key's head owns the key for the pass. For each head it owns, the pass also reads
-- the key's next rows, up to a fair share of the batch; the caller keeps the contiguous due ones.
--
-- $1 now, $2 batch size, $3 park keys behind dead-lettered rows.
WITH heads AS (
    SELECT o.seq, o.partition_key
    FROM {{schema}}.outbox AS o
    WHERE o.published_at IS NULL
      AND o.dead_lettered_at IS NULL
      AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= $1)
      AND NOT EXISTS (
          SELECT 1
          FROM {{schema}}.outbox AS e
          WHERE e.partition_key = o.partition_key
            AND e.seq < o.seq
            AND e.published_at IS NULL
            AND (e.dead_lettered_at IS NULL OR $3)
      )
    ORDER BY o.seq
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),
share AS (
    SELECT greatest(0, ceil(($2 - count(*))::numeric / greatest(count(*), 1)))::int AS per_key
    FROM heads
)
SELECT h.seq, h.partition_key, true AS head, true AS ready
FROM heads AS h
UNION ALL
SELECT f.seq, f.partition_key, false AS head,
       f.dead_lettered_at IS NULL AND (f.next_attempt_at IS NULL OR f.next_attempt_at <= $1) AS ready
FROM heads AS h
CROSS JOIN LATERAL (
    SELECT x.seq, x.partition_key, x.dead_lettered_at, x.next_attempt_at
    FROM {{schema}}.outbox AS x
    WHERE x.partition_key = h.partition_key
      AND x.seq > h.seq
      AND x.published_at IS NULL
      AND (x.dead_lettered_at IS NULL OR $3)
    ORDER BY x.seq
    LIMIT (SELECT per_key FROM share)
) AS f
