-- Per consumer: messages processed (inbox rows, within retention), duplicates absorbed, dead letters
-- waiting for a replay.
SELECT consumer, sum(processed)::bigint, sum(duplicates)::bigint, sum(dead)::bigint
FROM (
    SELECT consumer, count(*) AS processed, sum(duplicates) AS duplicates, 0 AS dead
    FROM {{schema}}.inbox GROUP BY consumer
    UNION ALL
    SELECT consumer, 0, 0, count(*) FROM {{schema}}.dead_letters WHERE replayed_at IS NULL GROUP BY consumer
) AS per_consumer
GROUP BY consumer
ORDER BY consumer
