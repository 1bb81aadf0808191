-- Per consumer: messages processed (inbox rows, within retention; parked ones included), duplicates
-- absorbed, dead letters waiting for a replay, messages parked by the order guard.
SELECT consumer, sum(processed)::bigint, sum(duplicates)::bigint, sum(dead)::bigint, sum(parked)::bigint
FROM (
    SELECT consumer, count(*) AS processed, sum(duplicates) AS duplicates, 0 AS dead, 0 AS parked
    FROM {{schema}}.inbox GROUP BY consumer
    UNION ALL
    SELECT consumer, 0, 0, count(*), 0 FROM {{schema}}.dead_letters WHERE replayed_at IS NULL AND archived_at IS NULL GROUP BY consumer
    UNION ALL
    SELECT consumer, 0, 0, 0, count(*) FROM {{schema}}.inbox_parked GROUP BY consumer
) AS per_consumer
GROUP BY consumer
ORDER BY consumer
