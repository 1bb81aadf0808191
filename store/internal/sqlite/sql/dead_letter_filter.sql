-- The dead-letter selection shared by listing and replay. Empty filters match all.
-- ?1 seqs, ?2 uuids, ?3 topic, ?4 partition key, ?5 error contains, ?6 from, ?7 until.
dead_lettered_at IS NOT NULL
AND published_at IS NULL
AND archived_at IS NULL
AND (#1 = 0 OR seq IN (?1))
AND (#2 = 0 OR uuid IN (?2))
AND (?3 = '' OR topic = ?3)
AND (?4 = '' OR partition_key = ?4)
AND (?5 = '' OR instr(last_error, ?5) > 0)
AND (?6 IS NULL OR dead_lettered_at >= ?6)
AND (?7 IS NULL OR dead_lettered_at < ?7)
