-- Per consumer: messages processed, duplicates absorbed, dead letters waiting for a replay.
SELECT consumer, SUM(processed), SUM(duplicates), SUM(dead)
FROM (
    SELECT consumer, COUNT(*) AS processed, SUM(duplicates) AS duplicates, 0 AS dead
    FROM {{schema}}.inbox GROUP BY consumer
    UNION ALL
    SELECT consumer, 0, 0, COUNT(*) FROM {{schema}}.dead_letters WHERE replayed_at IS NULL GROUP BY consumer
) AS per_consumer
GROUP BY consumer
ORDER BY consumer
