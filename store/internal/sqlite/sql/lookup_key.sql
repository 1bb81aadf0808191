-- ?1 scope, ?2 key.
SELECT request_hash, status, headers, body FROM {{schema}}.idempotency_keys WHERE scope = ?1 AND key = ?2
