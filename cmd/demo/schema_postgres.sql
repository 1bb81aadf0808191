-- The demo's business tables on Postgres, beside outboxkit's in the same schema.
CREATE TABLE IF NOT EXISTS {{t}}.orders (
    id          text        PRIMARY KEY,
    customer    text        NOT NULL,
    total_cents integer     NOT NULL,
    version     integer     NOT NULL DEFAULT 1,
    status      text        NOT NULL DEFAULT 'placed',
    created_at  timestamptz NOT NULL
);
-- Nothing in shipments or invoices stops a second row for one order: the consumers' inboxes do.
CREATE TABLE IF NOT EXISTS {{t}}.shipments (
    id           bigserial   PRIMARY KEY,
    order_id     text        NOT NULL,
    created_at   timestamptz NOT NULL,
    cancelled_at timestamptz
);
CREATE INDEX IF NOT EXISTS shipments_order ON {{t}}.shipments (order_id);
CREATE TABLE IF NOT EXISTS {{t}}.invoices (
    id           bigserial   PRIMARY KEY,
    order_id     text        NOT NULL,
    amount_cents integer     NOT NULL,
    created_at   timestamptz NOT NULL,
    refunded_at  timestamptz
);
CREATE INDEX IF NOT EXISTS invoices_order ON {{t}}.invoices (order_id);
CREATE TABLE IF NOT EXISTS {{t}}.search_entries (
    order_id   text        PRIMARY KEY,
    document   text        NOT NULL,
    updated_at timestamptz NOT NULL
);
-- Every effect a consumer commits, one row per handler run, in the handler's transaction: a
-- redelivery that got past an inbox would show as a second row.
CREATE TABLE IF NOT EXISTS {{t}}.effects (
    id         bigserial   PRIMARY KEY,
    consumer   text        NOT NULL,
    order_id   text        NOT NULL,
    event      text        NOT NULL,
    message_id text        NOT NULL,
    applied_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS effects_order ON {{t}}.effects (order_id);
