-- The demo's business tables on SQLite, beside outboxkit's in the same file. Times are UTC text.
CREATE TABLE IF NOT EXISTS orders (
    id          TEXT    PRIMARY KEY,
    customer    TEXT    NOT NULL,
    total_cents INTEGER NOT NULL,
    version     INTEGER NOT NULL DEFAULT 1,
    status      TEXT    NOT NULL DEFAULT 'placed',
    created_at  TEXT    NOT NULL
);
CREATE TABLE IF NOT EXISTS shipments (
    order_id     TEXT PRIMARY KEY,
    created_at   TEXT NOT NULL,
    cancelled_at TEXT
);
CREATE TABLE IF NOT EXISTS invoices (
    order_id     TEXT    PRIMARY KEY,
    amount_cents INTEGER NOT NULL,
    created_at   TEXT    NOT NULL,
    refunded_at  TEXT
);
CREATE TABLE IF NOT EXISTS search_entries (
    order_id   TEXT PRIMARY KEY,
    document   TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
