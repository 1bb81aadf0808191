-- The demo's business tables on MySQL or MariaDB, beside outboxkit's in the same database.
CREATE TABLE IF NOT EXISTS {{t}}.orders (
    id          VARCHAR(64)  NOT NULL PRIMARY KEY,
    customer    VARCHAR(255) NOT NULL,
    total_cents INT          NOT NULL,
    version     INT          NOT NULL DEFAULT 1,
    status      VARCHAR(16)  NOT NULL DEFAULT 'placed',
    created_at  DATETIME(6)  NOT NULL
);
-- Nothing in shipments or invoices stops a second row for one order: the consumers' inboxes do.
CREATE TABLE IF NOT EXISTS {{t}}.shipments (
    id           BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    order_id     VARCHAR(64) NOT NULL,
    created_at   DATETIME(6) NOT NULL,
    cancelled_at DATETIME(6) NULL,
    INDEX shipments_order (order_id)
);
CREATE TABLE IF NOT EXISTS {{t}}.invoices (
    id           BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
    order_id     VARCHAR(64) NOT NULL,
    amount_cents INT         NOT NULL,
    created_at   DATETIME(6) NOT NULL,
    refunded_at  DATETIME(6) NULL,
    INDEX invoices_order (order_id)
);
CREATE TABLE IF NOT EXISTS {{t}}.search_entries (
    order_id   VARCHAR(64)  NOT NULL PRIMARY KEY,
    document   TEXT         NOT NULL,
    updated_at DATETIME(6)  NOT NULL
);
-- Every effect a consumer commits, one row per handler run, in the handler's transaction: a
-- redelivery that got past an inbox would show as a second row.
CREATE TABLE IF NOT EXISTS {{t}}.effects (
    id         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    consumer   VARCHAR(64)  NOT NULL,
    order_id   VARCHAR(64)  NOT NULL,
    event      VARCHAR(64)  NOT NULL,
    message_id VARCHAR(255) NOT NULL,
    applied_at DATETIME(6)  NOT NULL,
    INDEX effects_order (order_id)
);
