-- Take an outbox's lease: ?1 fleet, ?2 outbox, ?3 member, ?4 term (µs). A new lease has token 1;
-- one released or expired passes to ?3 with the next token; ?3's own is renewed with its token;
-- one another member holds is left alone and nothing is returned. SQLite's single writer makes
-- the statement atomic; excluded.renewed_at is the clock.
INSERT INTO {{schema}}.fleet_leases (fleet, outbox, owner, token, acquired_at, renewed_at, expires_at)
VALUES (?1, ?2, ?3, 1, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'), strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'),
    strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', (?4 / 1000000.0) || ' seconds'))
ON CONFLICT (fleet, outbox) DO UPDATE SET
    token       = CASE WHEN owner = '' OR expires_at <= excluded.renewed_at THEN token + 1 ELSE token END,
    acquired_at = CASE WHEN owner = '' OR expires_at <= excluded.renewed_at THEN excluded.acquired_at ELSE acquired_at END,
    owner = excluded.owner, renewed_at = excluded.renewed_at, expires_at = excluded.expires_at
WHERE owner = excluded.owner OR owner = '' OR expires_at <= excluded.renewed_at
RETURNING outbox, owner, token, acquired_at, renewed_at, expires_at
