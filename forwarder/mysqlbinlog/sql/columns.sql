-- The outbox's columns in their order, which a row image without names follows. ?1 the database.
SELECT COLUMN_NAME FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'outbox'
ORDER BY ORDINAL_POSITION
