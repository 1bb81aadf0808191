-- Retention.DeleteOnPublish: the row goes in the pass that published it. ?1 seqs, ?2 lease owner.
DELETE FROM {{schema}}.outbox WHERE seq IN (?1) AND lease_owner = ?2
