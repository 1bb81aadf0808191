-- The demo's business tables on SQLite, beside outboxkit's in the same file. Times are UTC text.
CREATE TABLE IF NOT EXISTS orders (
    id          TEXT    PRIMARY KEY,
    customer    TEXT    NOT NULL,
    total_cents INTEGER NOT NULL,
    version     INTEGER NOT NULL DEFAULT 1,
    status      TEXT    NOT NULL DEFAULT 'placed',
    created_at  TEXT    NOT NULL
);
-- Nothing in shipments or invoices stops a second row for one order: the consumers' inboxes do.
CREATE TABLE IF NOT EXISTS shipments (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    order_id     TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    cancelled_at TEXT
);
CREATE INDEX IF NOT EXISTS shipments_order ON shipments (order_id);
CREATE TABLE IF NOT EXISTS invoices (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    order_id     TEXT    NOT NULL,
    amount_cents INTEGER NOT NULL,
    created_at   TEXT    NOT NULL,
    refunded_at  TEXT
);
CREATE INDEX IF NOT EXISTS invoices_order ON invoices (order_id);
CREATE TABLE IF NOT EXISTS search_entries (
    order_id   TEXT PRIMARY KEY,
    document   TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
-- Every effect a consumer commits, one row per handler run, in the handler's transaction: a
-- redelivery that got past an inbox would show as a second row.
CREATE TABLE IF NOT EXISTS effects (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer   TEXT NOT NULL,
    order_id   TEXT NOT NULL,
    event      TEXT NOT NULL,
    message_id TEXT NOT NULL,
    applied_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS effects_order ON effects (order_id);
