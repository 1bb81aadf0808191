-- The demo's business tables, beside outboxkit's in the same schema.
CREATE TABLE IF NOT EXISTS {{schema}}.orders (
    id          text        PRIMARY KEY,
    customer    text        NOT NULL,
    total_cents integer     NOT NULL,
    version     integer     NOT NULL DEFAULT 1,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {{schema}}.shipments (
    order_id   text        PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {{schema}}.invoices (
    order_id     text        PRIMARY KEY,
    amount_cents integer     NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {{schema}}.search_entries (
    order_id   text        PRIMARY KEY,
    document   text        NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
