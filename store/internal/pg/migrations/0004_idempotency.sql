-- Responses of requests made with an Idempotency-Key, replayed when the request is retried.
CREATE TABLE {{schema}}.idempotency_keys (
    key          text        NOT NULL,
    scope        text        NOT NULL, -- method and path: a key is only reused on the same endpoint
    request_hash bytea       NOT NULL, -- the body's hash: the same key with another body is refused
    status       integer     NOT NULL,
    headers      jsonb       NOT NULL,
    body         bytea       NOT NULL,
    created_at   timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);

CREATE INDEX idempotency_keys_created_at_idx ON {{schema}}.idempotency_keys (created_at);
