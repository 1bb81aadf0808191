-- Whether a relay is awake: while awake_until is ahead, a relay is running passes back to back and
-- polling between them, and writers skip pg_notify (Postgres serialises the commits of notifying
-- transactions, which costs more than the row under many writers). One row.
CREATE TABLE {{schema}}.relay_awake (
    singleton   boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    awake_until timestamptz NOT NULL
);
INSERT INTO {{schema}}.relay_awake (awake_until) VALUES ('-infinity');
