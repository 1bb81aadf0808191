-- Per consumer: messages processed (parked ones included), duplicates absorbed, dead letters
-- waiting for a replay, messages parked by the order guard.
SELECT consumer, SUM(processed), SUM(duplicates), SUM(dead), SUM(parked)
FROM (
    SELECT consumer, COUNT(*) AS processed, SUM(duplicates) AS duplicates, 0 AS dead, 0 AS parked
    FROM {{schema}}.inbox GROUP BY consumer
    UNION ALL
    SELECT consumer, 0, 0, COUNT(*), 0 FROM {{schema}}.dead_letters WHERE replayed_at IS NULL AND archived_at IS NULL GROUP BY consumer
    UNION ALL
    SELECT consumer, 0, 0, 0, COUNT(*) FROM {{schema}}.inbox_parked GROUP BY consumer
) AS per_consumer
GROUP BY consumer
ORDER BY consumer
