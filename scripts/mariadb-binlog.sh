#!/usr/bin/env bash
# A private MariaDB server with the binary log on (log_bin, binlog_format = ROW, binlog_row_image =
# FULL, GTIDs in strict mode), for the binlog relay's tests (forwarder/mysqlbinlog), .ci/run and the
# bench: the shared server on :3306 is never reconfigured nor restarted for them, and the tests
# change this one's global settings (binlog_format, binlog_row_image) while they run.
#
# Usage: scripts/mariadb-binlog.sh start      start it if it is not running (idempotent); data in
#                                            .cache/mariadb-binlog/ of this repository, created on
#                                            first use
#        scripts/mariadb-binlog.sh stop       stop it (a clean shutdown; nothing to do if it is not
#                                            running)
#        scripts/mariadb-binlog.sh url        print the URL the tests read (OUTBOXKIT_TEST_MYSQLBINLOG_URL)
#        scripts/mariadb-binlog.sh status     say whether it runs
#        scripts/mariadb-binlog.sh with CMD…  start it, run CMD with OUTBOXKIT_TEST_MYSQLBINLOG_URL set,
#                                            and stop it afterwards if this call started it (also on
#                                            failure or interrupt); CMD's exit status is the script's
#
# MARIADB_BINLOG_PORT chooses the port (default 53306), MARIADB_BINLOG_BIN the folder of mariadbd
# (default /usr/sbin) and MARIADB_BINLOG_CLIENT the folder of mariadb-install-db, mariadb and
# mariadb-admin (default /usr/bin). The server and mariadb-install-db run as the mysql OS user when
# the script runs as root, which owns the data folder; root connects from 127.0.0.1 with no
# password. Its server_id is 1 and its gtid_domain_id 1, so its GTIDs read 1-1-N.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
port=${MARIADB_BINLOG_PORT:-53306}
bin=${MARIADB_BINLOG_BIN:-/usr/sbin}
client=${MARIADB_BINLOG_CLIENT:-/usr/bin}
dir="$root/.cache/mariadb-binlog/$port" # one server per port: a data folder serves the port it was made for
data="$dir/data"
cnf="$dir/my.cnf"
pidfile="$dir/mariadbd.pid"
log="$dir/server.log"
url="mysql://root@127.0.0.1:$port/test"

die() { echo "mariadb-binlog: $*" >&2; exit 1; }

[ -x "$bin/mariadbd" ] || die "no MariaDB server in '$bin' (mariadbd): install mariadb-server (10.6 or newer) or set MARIADB_BINLOG_BIN"
for tool in mariadb-install-db mariadb mariadb-admin; do
  [ -x "$client/$tool" ] || die "no $tool in '$client': install mariadb-server and mariadb-client or set MARIADB_BINLOG_CLIENT"
done

# as_my runs a command as the server's owner: the mysql OS user when we are root (the server
# refuses to run as root), ourselves otherwise.
as_my() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u mysql -- "$@"
  else
    "$@"
  fi
}

# The client tools read no option file but the server's: the machine's own (/etc/mysql) name the
# shared server's socket and port.
sql() { "$client/mariadb" --no-defaults --protocol=TCP -h 127.0.0.1 -P "$port" -u root "$@"; }

running() {
  [ -f "$pidfile" ] || return 1
  local pid
  pid=$(cat "$pidfile" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

init() {
  mkdir -p "$dir"
  if [ "$(id -u)" = 0 ]; then
    chown mysql: "$dir"
    # The server's user must reach the data folder through the repository's path.
    local p=$dir
    while [ "$p" != / ]; do
      p=$(dirname "$p")
      runuser -u mysql -- test -x "$p" || die "the mysql user cannot enter $p: chmod o+x it"
    done
  fi
  as_my tee "$cnf" >/dev/null <<EOF
# scripts/mariadb-binlog.sh: a private server for the binlog relay (the binary log in ROW format).
[mariadbd]
datadir = $data
port = $port
bind-address = 127.0.0.1
socket = $dir/mariadbd.sock
pid-file = $pidfile
log-error = $log
skip-name-resolve
server-id = 1
log-bin = mariadb-bin
binlog-format = ROW
binlog-row-image = FULL
gtid-domain-id = 1
gtid-strict-mode = 1
# Old binary logs go after a day (the tests leave little behind), and a file holds 64 MB at most.
binlog-expire-logs-seconds = 86400
max-binlog-size = 64M
max-connections = 200
character-set-server = utf8mb4
collation-server = utf8mb4_bin
innodb-buffer-pool-size = 64M
innodb-log-file-size = 32M
# A test server: no fsync at each commit, neither of the redo log nor of the binary log.
innodb-flush-log-at-trx-commit = 2
sync-binlog = 0
EOF
  as_my "$client/mariadb-install-db" --defaults-file="$cnf" --auth-root-authentication-method=normal \
    --skip-test-db >"$dir/install.log" 2>&1 || die "mariadb-install-db failed, see $dir/install.log"
}

start() { # prints "started" when this call started the server
  if running; then
    return 0
  fi
  [ -d "$data/mysql" ] || init
  if port_open "$port"; then
    die "127.0.0.1:$port is taken by another server: set MARIADB_BINLOG_PORT to a free port"
  fi
  # A session of its own: an interrupt of the caller's terminal reaches the trap below, which
  # shuts the server down cleanly, not the server itself.
  # What it prints before its error log is open goes to console.log.
  as_my touch "$dir/console.log"
  # A simple command, not as_my: a function run in the background is a subshell that keeps the
  # caller's descriptors (a pipe it is read through, say) open as long as the server runs.
  if [ "$(id -u)" = 0 ]; then
    setsid runuser -u mysql -- "$bin/mariadbd" --defaults-file="$cnf" </dev/null >>"$dir/console.log" 2>&1 &
  else
    setsid "$bin/mariadbd" --defaults-file="$cnf" </dev/null >>"$dir/console.log" 2>&1 &
  fi
  local i
  for i in $(seq 1 600); do
    if "$client/mariadb-admin" --no-defaults --protocol=TCP -h 127.0.0.1 -P "$port" -u root --connect-timeout=1 ping >/dev/null 2>&1; then
      break
    fi
    if [ "$i" = 600 ]; then
      die "the server did not start within 60s, see $log and $dir/console.log"
    fi
    sleep 0.1
  done
  sql -e "CREATE DATABASE IF NOT EXISTS test" >/dev/null
  echo started
}

stop() {
  if running; then
    local pid
    pid=$(cat "$pidfile")
    "$client/mariadb-admin" --no-defaults --protocol=TCP -h 127.0.0.1 -P "$port" -u root shutdown >/dev/null 2>&1 ||
      kill "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 600); do
      kill -0 "$pid" 2>/dev/null || return 0
      sleep 0.1
    done
    die "the server (pid $pid) did not stop within 60s, see $log"
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
    OUTBOXKIT_TEST_MYSQLBINLOG_URL="$url" "$@" || rc=$?
    exit "$rc"
    ;;
  *) die "usage: $0 start|stop|url|status|with CMD…" ;;
esac
