-- The demo's business tables on Postgres, beside outboxkit's in the same schema.
CREATE TABLE IF NOT EXISTS {{t}}.orders (
    id          text        PRIMARY KEY,
    customer    text        NOT NULL,
    total_cents integer     NOT NULL,
    version     integer     NOT NULL DEFAULT 1,
    status      text        NOT NULL DEFAULT 'placed',
    created_at  timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS {{t}}.shipments (
    order_id     text        PRIMARY KEY,
    created_at   timestamptz NOT NULL,
    cancelled_at timestamptz
);
CREATE TABLE IF NOT EXISTS {{t}}.invoices (
    order_id     text        PRIMARY KEY,
    amount_cents integer     NOT NULL,
    created_at   timestamptz NOT NULL,
    refunded_at  timestamptz
);
CREATE TABLE IF NOT EXISTS {{t}}.search_entries (
    order_id   text        PRIMARY KEY,
    document   text        NOT NULL,
    updated_at timestamptz NOT NULL
);
