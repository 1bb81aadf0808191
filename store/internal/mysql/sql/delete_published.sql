-- Retention.DeleteOnPublish: the row goes in the pass that published it. ?1 seqs.
DELETE FROM {{schema}}.outbox WHERE seq IN (?1)
