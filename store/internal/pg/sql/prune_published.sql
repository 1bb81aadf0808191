-- Delete up to $2 rows published before $1, oldest first, through the published_at index (by row
-- address: seq has no index of its own outside the pending one).
DELETE FROM {{schema}}.outbox
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM {{schema}}.outbox
    WHERE published_at IS NOT NULL AND published_at < $1
    ORDER BY published_at
    LIMIT $2
))
