-- A member's record of its catalog: ?1 fleet, ?2 member, then the rows. The owner's backlog
-- reading is written only by a row that carries one (stats_at set); every condition reads the row
-- given (VALUES), so the order of the assignments does not matter.
INSERT INTO {{schema}}.fleet_outboxes (fleet, outbox, tenant, disabled, recorded_by, recorded_at, first_recorded_at,
    pending, oldest_pending_us, stats_at, error)
VALUES {{rows}}
ON DUPLICATE KEY UPDATE tenant = VALUES(tenant), disabled = VALUES(disabled), recorded_by = VALUES(recorded_by),
    recorded_at = VALUES(recorded_at),
    pending = IF(VALUES(stats_at) IS NULL, pending, VALUES(pending)),
    oldest_pending_us = IF(VALUES(stats_at) IS NULL, oldest_pending_us, VALUES(oldest_pending_us)),
    error = IF(VALUES(stats_at) IS NULL, error, VALUES(error)),
    stats_at = IF(VALUES(stats_at) IS NULL, stats_at, VALUES(stats_at))
