-- Delete up to ?2 rows published before ?1, oldest first.
DELETE FROM {{schema}}.outbox
WHERE seq IN (
    SELECT seq FROM {{schema}}.outbox
    WHERE published_at IS NOT NULL AND published_at < ?1
    ORDER BY published_at
    LIMIT ?2
)
