-- Responses of requests made with an Idempotency-Key, replayed when the request is retried.
CREATE TABLE IF NOT EXISTS {{schema}}.idempotency_keys (
    key          TEXT    NOT NULL,
    scope        TEXT    NOT NULL,
    request_hash BLOB    NOT NULL,
    status       INTEGER NOT NULL,
    headers      TEXT    NOT NULL,
    body         BLOB    NOT NULL,
    created_at   TEXT    NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS {{schema}}.idempotency_keys_created_at_idx ON idempotency_keys (created_at);
