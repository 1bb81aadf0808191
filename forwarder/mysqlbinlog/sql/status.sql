-- The binlog relay groups' checkpoints, for an operator: the checkpoint, its age by the server's
-- clock (updated_at is UTC; formatted, so that a connection with parseTime reads it the same), and
-- whether an operator pauses the group. ?1 and ?2 a group's name, or NULL for all.
SELECT c.name, c.progress, c.gtid_set, c.file, c.pos, DATE_FORMAT(c.updated_at, '%Y-%m-%d %H:%i:%s.%f'),
    TIMESTAMPDIFF(MICROSECOND, c.updated_at, UTC_TIMESTAMP(6)),
    EXISTS (SELECT 1 FROM {{schema}}.pauses p WHERE p.scope = 'relay' AND p.name = c.name)
FROM {{schema}}.binlog_relays c
WHERE ? IS NULL OR c.name = ?
ORDER BY c.name
