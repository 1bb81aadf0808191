-- Record an Idempotency-Key for a request. ?1 key, ?2 scope, ?3 request hash, ?4 now.
INSERT INTO {{schema}}.idempotency_keys (key, scope, request_hash, status, headers, body, created_at)
VALUES (?1, ?2, ?3, 0, '{}', x'', ?4)
ON CONFLICT (scope, key) DO NOTHING
