-- ?1 scope, ?2 key, ?3 status, ?4 headers (JSON), ?5 body.
UPDATE {{schema}}.idempotency_keys SET status = ?3, headers = ?4, body = ?5 WHERE scope = ?1 AND key = ?2
