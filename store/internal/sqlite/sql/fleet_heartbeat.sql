-- A member's heartbeat: ?1 fleet, ?2 member, ?3 host, ?4 pid, ?5 started at, ?6 outboxes owned,
-- ?7 term (µs). Returns the database's clock.
INSERT INTO {{schema}}.fleet_members (fleet, member, host, pid, started_at, owned, heartbeat_at, expires_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'),
    strftime('%Y-%m-%dT%H:%M:%f000Z', 'now', (?7 / 1000000.0) || ' seconds'))
ON CONFLICT (fleet, member) DO UPDATE SET host = excluded.host, pid = excluded.pid, started_at = excluded.started_at,
    owned = excluded.owned, heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at
RETURNING heartbeat_at
