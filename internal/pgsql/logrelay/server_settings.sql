-- What the relay needs of the server, read at start: wal_level, the version, the role and whether
-- it may open a replication connection.
SELECT current_setting('wal_level'), current_setting('server_version_num')::int, current_user,
    coalesce((SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user), false)
