-- Records the relay group's checkpoint, in the transaction that removes the rows published behind
-- it. ?1 name, ?2 flavor, ?3 server_id, ?4 progress ('gtid' or 'file'), ?5 GTID set, ?6 file,
-- ?7 position, ?8 backfilled (0/1), ?9 the time (UTC).
INSERT INTO {{schema}}.binlog_relays (name, flavor, server_id, progress, gtid_set, file, pos, backfilled, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON DUPLICATE KEY UPDATE flavor = VALUES(flavor), server_id = VALUES(server_id), progress = VALUES(progress),
    gtid_set = VALUES(gtid_set), file = VALUES(file), pos = VALUES(pos), backfilled = VALUES(backfilled),
    updated_at = VALUES(updated_at)
