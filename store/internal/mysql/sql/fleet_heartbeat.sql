-- A member's heartbeat: ?1 fleet, ?2 member, ?3 host, ?4 pid, ?5 started at, ?6 outboxes owned,
-- ?7 term (µs).
INSERT INTO {{schema}}.fleet_members (fleet, member, host, pid, started_at, owned, heartbeat_at, expires_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ?7 MICROSECOND)
ON DUPLICATE KEY UPDATE host = VALUES(host), pid = VALUES(pid), started_at = VALUES(started_at), owned = VALUES(owned),
    heartbeat_at = VALUES(heartbeat_at), expires_at = VALUES(expires_at)
