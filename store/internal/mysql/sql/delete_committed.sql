-- mark_committed with Retention.DeleteOnPublish. ?1 seqs.
DELETE FROM {{schema}}.outbox WHERE seq IN (?1) AND published_at IS NULL AND dead_lettered_at IS NULL
