-- Delete up to ?3 delivery counts of consumer ?1 (all consumers when '') last seen before ?2.
DELETE FROM {{schema}}.inbox_deliveries WHERE last_seen_at < ?2 AND (?1 = '' OR consumer = ?1) LIMIT ?3
