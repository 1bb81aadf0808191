-- How many of the transactions are still running for a new snapshot.
--
-- pgoutput sends 32-bit transaction ids; the snapshot's are 64-bit (epoch and id): an id takes the
-- epoch of the snapshot's xmax, or the one before when that puts it above xmax. A transaction is
-- running for the snapshot when it is at or above xmax, or in its list.
-- $1 the transaction ids.
WITH s AS (SELECT txid_current_snapshot() AS snap),
e AS (SELECT snap, txid_snapshot_xmax(snap) AS xmax, txid_snapshot_xmax(snap) / 4294967296 * 4294967296 AS epoch FROM s)
SELECT count(*) FROM e, unnest($1::bigint[]) AS id
WHERE NOT txid_visible_in_snapshot(CASE WHEN e.epoch + id > e.xmax AND e.epoch > 0 THEN e.epoch + id - 4294967296 ELSE e.epoch + id END, e.snap)
