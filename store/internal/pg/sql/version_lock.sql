-- The last version applied for a key, locked for the rest of the inbox transaction, so that two
-- deliveries for one key are judged one after the other. $1 consumer, $2 partition key.
SELECT version FROM {{schema}}.inbox_versions WHERE consumer = $1 AND partition_key = $2 FOR UPDATE
