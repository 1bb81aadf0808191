#!/usr/bin/env bash
# Install the clients outboxkit does not control that the interoperability tests drive: kcat (a
# librdkafka Kafka client, from Debian) and the npm amqplib in tools/interop. Idempotent.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

if ! command -v kcat >/dev/null 2>&1 && ! command -v kafkacat >/dev/null 2>&1; then
  echo "tools: installing kcat" >&2
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q kcat >/dev/null ||
    { $sudo apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q kcat >/dev/null; }
fi

if [ ! -d "$root/tools/interop/node_modules/amqplib" ]; then
  command -v npm >/dev/null 2>&1 || { echo "tools: npm is missing: install Node.js 18 or newer" >&2; exit 1; }
  echo "tools: installing amqplib into tools/interop" >&2
  (cd "$root/tools/interop" && npm ci --no-audit --no-fund --silent)
fi
