-- Give rows back before their lease ends. ?1 seqs, ?2 owner.
UPDATE {{schema}}.outbox SET lease_owner = NULL, lease_until = NULL WHERE seq IN (?1) AND lease_owner = ?2
