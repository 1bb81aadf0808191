-- The demo's business tables on MySQL or MariaDB, beside outboxkit's in the same database.
CREATE TABLE IF NOT EXISTS {{t}}.orders (
    id          VARCHAR(64)  NOT NULL PRIMARY KEY,
    customer    VARCHAR(255) NOT NULL,
    total_cents INT          NOT NULL,
    version     INT          NOT NULL DEFAULT 1,
    status      VARCHAR(16)  NOT NULL DEFAULT 'placed',
    created_at  DATETIME(6)  NOT NULL
);
CREATE TABLE IF NOT EXISTS {{t}}.shipments (
    order_id     VARCHAR(64) NOT NULL PRIMARY KEY,
    created_at   DATETIME(6) NOT NULL,
    cancelled_at DATETIME(6) NULL
);
CREATE TABLE IF NOT EXISTS {{t}}.invoices (
    order_id     VARCHAR(64) NOT NULL PRIMARY KEY,
    amount_cents INT         NOT NULL,
    created_at   DATETIME(6) NOT NULL,
    refunded_at  DATETIME(6) NULL
);
CREATE TABLE IF NOT EXISTS {{t}}.search_entries (
    order_id   VARCHAR(64)  NOT NULL PRIMARY KEY,
    document   TEXT         NOT NULL,
    updated_at DATETIME(6)  NOT NULL
);
