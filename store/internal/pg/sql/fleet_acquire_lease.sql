-- Take an outbox's lease: $1 fleet, $2 outbox, $3 member, $4 term (µs). A new lease has token 1;
-- one released or expired passes to $3 with the next token; $3's own is renewed with its token;
-- one another member holds is left alone and nothing is returned. Concurrent callers meet on the
-- row (the insert's unique key, then its row lock) and the loser sees the winner's row.
INSERT INTO {{schema}}.fleet_leases AS l (fleet, outbox, owner, token, acquired_at, renewed_at, expires_at)
VALUES ($1, $2, $3, 1, now(), now(), now() + $4::bigint * interval '1 microsecond')
ON CONFLICT (fleet, outbox) DO UPDATE SET
    token       = CASE WHEN l.owner = '' OR l.expires_at <= now() THEN l.token + 1 ELSE l.token END,
    acquired_at = CASE WHEN l.owner = '' OR l.expires_at <= now() THEN now() ELSE l.acquired_at END,
    owner = excluded.owner, renewed_at = excluded.renewed_at, expires_at = excluded.expires_at
WHERE l.owner = excluded.owner OR l.owner = '' OR l.expires_at <= now()
RETURNING l.outbox, l.owner, l.token, l.acquired_at, l.renewed_at, l.expires_at
