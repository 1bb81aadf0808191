-- How many more replication slots the server takes, and how many it takes in all.
SELECT current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots)::int,
    current_setting('max_replication_slots')::int
