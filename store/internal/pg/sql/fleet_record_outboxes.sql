-- A member's record of its catalog: $1 fleet, $2 member, then the rows. The owner's backlog
-- reading is written only by a row that carries one (stats_at set).
INSERT INTO {{schema}}.fleet_outboxes AS o (fleet, outbox, tenant, disabled, recorded_by, recorded_at, first_recorded_at,
    pending, oldest_pending_us, stats_at, error)
VALUES {{rows}}
ON CONFLICT (fleet, outbox) DO UPDATE SET tenant = excluded.tenant, disabled = excluded.disabled,
    recorded_by = excluded.recorded_by, recorded_at = excluded.recorded_at,
    pending = CASE WHEN excluded.stats_at IS NULL THEN o.pending ELSE excluded.pending END,
    oldest_pending_us = CASE WHEN excluded.stats_at IS NULL THEN o.oldest_pending_us ELSE excluded.oldest_pending_us END,
    error = CASE WHEN excluded.stats_at IS NULL THEN o.error ELSE excluded.error END,
    stats_at = coalesce(excluded.stats_at, o.stats_at)
