#!/usr/bin/env bash
# A private Postgres cluster with wal_level = logical, for the log relay's tests, .ci/run and the
# bench: the shared server on :5432 runs wal_level = replica and is never restarted for them.
#
# Usage: scripts/pg-logical.sh start      start it if it is not running (idempotent); data in
#                                         .cache/pg-logical/ of this repository, created on first use
#        scripts/pg-logical.sh stop       stop it (fast shutdown; nothing to do if it is not running)
#        scripts/pg-logical.sh url        print the URL the tests read (OUTBOXKIT_TEST_PGLOGICAL_URL)
#        scripts/pg-logical.sh status     say whether it runs
#        scripts/pg-logical.sh with CMD…  start it, run CMD with OUTBOXKIT_TEST_PGLOGICAL_URL set, and
#                                         stop it afterwards if this call started it (also on failure
#                                         or interrupt); CMD's exit status is the script's
#
# PG_LOGICAL_PORT chooses the port (default 55432), PG_LOGICAL_BIN the server's binaries (default
# the newest /usr/lib/postgresql/*/bin). initdb and pg_ctl run as the postgres OS user when the
# script runs as root, which owns the data folder; the server trusts connections from 127.0.0.1,
# replication connections included.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
port=${PG_LOGICAL_PORT:-55432}
bin=${PG_LOGICAL_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)}
dir="$root/.cache/pg-logical/$port" # one cluster per port: a data folder serves the port it was made for
data="$dir/data"
log="$dir/server.log"
url="postgres://postgres@127.0.0.1:$port/test?sslmode=disable"

die() { echo "pg-logical: $*" >&2; exit 1; }

[ -x "$bin/pg_ctl" ] || die "no Postgres server binaries in '$bin': install postgresql (15 or newer) or set PG_LOGICAL_BIN"

# as_pg runs a command as the cluster's owner: the postgres OS user when we are root (initdb and
# the server refuse to run as root), ourselves otherwise.
as_pg() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

running() { as_pg "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

init() {
  mkdir -p "$dir"
  if [ "$(id -u)" = 0 ]; then
    chown postgres: "$dir"
    # The server's user must reach the data folder through the repository's path.
    local p=$dir
    while [ "$p" != / ]; do
      p=$(dirname "$p")
      runuser -u postgres -- test -x "$p" || die "the postgres user cannot enter $p: chmod o+x it"
    done
  fi
  as_pg "$bin/initdb" -D "$data" -U postgres --auth=trust --encoding=UTF8 --locale=C >"$dir/initdb.log" 2>&1 ||
    die "initdb failed, see $dir/initdb.log"
  as_pg tee -a "$data/postgresql.conf" >/dev/null <<EOF

# scripts/pg-logical.sh: a private cluster for the log relay (logical replication).
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$data'
wal_level = logical
max_replication_slots = 32
max_wal_senders = 32
# A slot nobody reads is invalidated past this much retained WAL instead of filling the disk.
max_slot_wal_keep_size = '256MB'
wal_sender_timeout = '10s'
max_connections = 200
shared_buffers = '64MB'
log_min_messages = warning
EOF
  as_pg tee "$data/pg_hba.conf" >/dev/null <<EOF
local all         all                trust
host  all         all  127.0.0.1/32  trust
host  replication all  127.0.0.1/32  trust
EOF
}

start() { # prints "started" when this call started the server
  if running; then
    return 0
  fi
  [ -f "$data/PG_VERSION" ] || init
  if port_open "$port"; then
    die "127.0.0.1:$port is taken by another server: set PG_LOGICAL_PORT to a free port"
  fi
  as_pg "$bin/pg_ctl" -D "$data" -l "$log" -w -t 60 -o "-p $port" start >/dev/null ||
    die "the server did not start, see $log"
  local db
  db=$(as_pg "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -Atc "SELECT 1 FROM pg_database WHERE datname = 'test'")
  if [ "$db" != 1 ]; then
    as_pg "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -qc "CREATE DATABASE test" >/dev/null
  fi
  echo started
}

stop() {
  if running; then
    as_pg "$bin/pg_ctl" -D "$data" -w -t 60 -m fast stop >/dev/null
  fi
}

case "${1:-}" in
  start) start >/dev/null ;;
  stop) stop ;;
  url) echo "$url" ;;
  status) if running; then echo "running on 127.0.0.1:$port ($data)"; else echo "not running"; exit 3; fi ;;
  with)
    shift
    [ $# -gt 0 ] || die "with needs a command"
    started=$(start)
    if [ "$started" = started ]; then
      trap stop EXIT INT TERM
    fi
    rc=0
    OUTBOXKIT_TEST_PGLOGICAL_URL="$url" "$@" || rc=$?
    exit "$rc"
    ;;
  *) die "usage: $0 start|stop|url|status|with CMD…" ;;
esac
