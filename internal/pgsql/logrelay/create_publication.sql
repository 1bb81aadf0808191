-- The relay group's publication: the outbox's INSERTs only. The placeholder is its quoted name.
CREATE PUBLICATION {{publication}} FOR TABLE {{schema}}.outbox WITH (publish = 'insert')
