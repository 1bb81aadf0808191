-- The demo's business tables, beside outboxkit's in the same schema.
CREATE TABLE IF NOT EXISTS {{schema}}.orders (
    id          text        PRIMARY KEY,
    customer    text        NOT NULL,
    total_cents integer     NOT NULL,
    version     integer     NOT NULL DEFAULT 1,
    status      text        NOT NULL DEFAULT 'placed',
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {{schema}}.shipments (
    order_id     text        PRIMARY KEY,
    created_at   timestamptz NOT NULL DEFAULT now(),
    cancelled_at timestamptz
);
CREATE TABLE IF NOT EXISTS {{schema}}.invoices (
    order_id     text        PRIMARY KEY,
    amount_cents integer     NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    refunded_at  timestamptz
);
CREATE TABLE IF NOT EXISTS {{schema}}.search_entries (
    order_id   text        PRIMARY KEY,
    document   text        NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
-- Columns added since the first version of the demo, for schemas it made before.
ALTER TABLE {{schema}}.orders ADD COLUMN IF NOT EXISTS status text NOT NULL DEFAULT 'placed';
ALTER TABLE {{schema}}.shipments ADD COLUMN IF NOT EXISTS cancelled_at timestamptz;
ALTER TABLE {{schema}}.invoices ADD COLUMN IF NOT EXISTS refunded_at timestamptz;
