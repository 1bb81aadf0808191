-- Responses of requests made with an Idempotency-Key, replayed when the request is retried.
CREATE TABLE IF NOT EXISTS {{schema}}.idempotency_keys (
    `key`        VARCHAR(255)  NOT NULL,
    scope        VARCHAR(255)  NOT NULL,
    request_hash VARBINARY(64) NOT NULL,
    status       INT           NOT NULL,
    headers      LONGTEXT      NOT NULL,
    body         LONGBLOB      NOT NULL,
    created_at   DATETIME(6)   NOT NULL,
    PRIMARY KEY (scope, `key`),
    KEY idempotency_keys_created_at_idx (created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
