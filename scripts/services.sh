#!/usr/bin/env bash
# Make sure the local services the tests and the demo need are up; start any that is down.
# Usage: scripts/services.sh [postgres] [mysql] [rabbitmq] [nats] [redis] [kafka]   (default: all of them)
#        scripts/services.sh --for ARGS…   (the services the URLs among ARGS name; none: nothing to do)
#
# kafka is franz-go's kfake (tools/kfake), a Kafka-protocol server built and started from this
# repository: no Kafka broker package exists for these machines. It keeps topics in memory.
set -euo pipefail

services=("$@")
if [ "${1:-}" = "--for" ]; then
  services=()
  for arg in "${@:2}"; do
    case "$arg" in
      *postgres://*|*postgresql://*) services+=(postgres) ;;
      *mysql://*) services+=(mysql) ;;
      *amqp://*|*amqps://*) services+=(rabbitmq) ;;
      *nats://*) services+=(nats) ;;
      *redis://*) services+=(redis) ;;
      *kafka://*) services+=(kafka) ;;
    esac
  done
  [ ${#services[@]} -gt 0 ] || exit 0
fi
[ ${#services[@]} -gt 0 ] || services=(postgres mysql rabbitmq nats redis kafka)
root=$(cd "$(dirname "$0")/.." && pwd)

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() { # name port seconds
  local i
  for ((i = 0; i < $3 * 5; i++)); do
    port_open "$2" && return 0
    sleep 0.2
  done
  echo "services: $1 did not come up on 127.0.0.1:$2 within $3s" >&2
  return 1
}

ensure() { # name port start-command...
  local name=$1 port=$2
  shift 2
  if port_open "$port"; then
    return 0
  fi
  echo "services: $name is down on 127.0.0.1:$port, starting it" >&2
  if ! "$@" >/dev/null 2>&1; then
    echo "services: could not start $name with: $*" >&2
    return 1
  fi
  wait_port "$name" "$port" 90
}

for s in "${services[@]}"; do
  case "$s" in
    postgres)
      ensure postgres 5432 bash -c 'pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start'
      for _ in $(seq 1 150); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.2; done
      pg_isready -q -h 127.0.0.1 -p 5432 || { echo "services: postgres accepts no connections" >&2; exit 1; }
      ;;
    mysql)
      # MariaDB 10.11 (MySQL 8 serves as well); root with no password, database test.
      ensure mysql 3306 start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
      ;;
    rabbitmq)
      ensure rabbitmq 5672 rabbitmq-server -detached
      ;;
    nats)
      ensure nats 4222 start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
        -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
      ;;
    redis)
      ensure redis 6379 redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
      ;;
    kafka)
      if ! port_open 9092; then
        mkdir -p "$root/.cache"
        (cd "$root/tools/kfake" && go build -o "$root/.cache/kfake" .)
        ensure kafka 9092 bash -c "setsid nohup '$root/.cache/kfake' -addr 127.0.0.1:9092 >'$root/.cache/kfake.log' 2>&1 < /dev/null &"
      fi
      ;;
    *)
      echo "services: unknown service $s (known: postgres mysql rabbitmq nats redis kafka)" >&2
      exit 2
      ;;
  esac
done
