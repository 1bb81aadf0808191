-- Retention.DeleteOnPublish: the row goes in the pass that published it. $1 seqs (rows this pass
-- claimed: pending, found through the pending index).
DELETE FROM {{schema}}.outbox
WHERE seq = ANY($1::bigint[]) AND published_at IS NULL AND dead_lettered_at IS NULL
