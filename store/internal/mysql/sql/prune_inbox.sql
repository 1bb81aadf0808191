-- Delete up to ?3 inbox rows of consumer ?1 (all consumers when '') processed before ?2.
DELETE FROM {{schema}}.inbox WHERE processed_at < ?2 AND (?1 = '' OR consumer = ?1) LIMIT ?3
