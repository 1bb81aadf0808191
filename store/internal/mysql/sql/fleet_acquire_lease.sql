-- Take an outbox's lease: ?1 fleet, ?2 outbox, ?3 member, ?4 term (µs). A new lease has token 1;
-- one released or expired passes to ?3 with the next token; ?3's own is renewed with its token;
-- one another member holds is left alone. Concurrent callers meet on the row's lock, which the
-- update of a duplicate key takes exclusively.
--
-- MySQL assigns left to right, each assignment seeing those before it; MariaDB with
-- SIMULTANEOUS_ASSIGNMENT sees the old row in all. The order makes both mean the same: every
-- condition reads owner and expires_at, assigned last; owner's own sees the old expires_at; and
-- expires_at's, seeing the new owner or the old, holds in the same cases (a member that may take
-- the lease is its owner once it has).
INSERT INTO {{schema}}.fleet_leases (fleet, outbox, owner, token, acquired_at, renewed_at, expires_at)
VALUES (?1, ?2, ?3, 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ?4 MICROSECOND)
ON DUPLICATE KEY UPDATE
    token       = IF(owner = '' OR expires_at <= UTC_TIMESTAMP(6), token + 1, token),
    acquired_at = IF(owner = '' OR expires_at <= UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), acquired_at),
    renewed_at  = IF(owner = VALUES(owner) OR owner = '' OR expires_at <= UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), renewed_at),
    owner       = IF(owner = VALUES(owner) OR owner = '' OR expires_at <= UTC_TIMESTAMP(6), VALUES(owner), owner),
    expires_at  = IF(owner = VALUES(owner) OR owner = '' OR expires_at <= UTC_TIMESTAMP(6), VALUES(expires_at), expires_at)
