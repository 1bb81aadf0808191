-- ?1 id, ?2 now.
UPDATE {{schema}}.dead_letters SET replayed_at = ?2 WHERE id = ?1
