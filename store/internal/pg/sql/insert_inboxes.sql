-- The inbox rows of a batch of messages, in the order given (sorted by the caller, so that two
-- batches sharing messages take their row locks in the same order). Returns the ids inserted; the
-- others are duplicates. $1 consumer, $2 message ids, $3 now.
INSERT INTO {{schema}}.inbox (consumer, message_id, processed_at)
SELECT $1, u.id, $3
FROM unnest($2::text[]) WITH ORDINALITY AS u(id, n)
ORDER BY u.n
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING message_id
