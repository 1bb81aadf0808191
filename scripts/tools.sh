#!/usr/bin/env bash
# Install the clients outboxkit does not control that the interoperability tests drive: kcat (a
# librdkafka Kafka client, from Debian), the npm amqplib and pg in tools/interop, and the Postgres
# drivers of the writers in other languages (tools/writers): Debian's python3-psycopg2 (for Debian's
# /usr/bin/python3) and libpostgresql-jdbc-java (/usr/share/java/postgresql.jar, compiled against
# with the JDK's javac, which Debian's openjdk-17-jdk-headless gives where it is missing). Idempotent.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
# apt_install PACKAGE…: from the package lists there are, or, when one is not in them, after an update.
apt_install() {
  echo "tools: installing $*" >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "$@" >/dev/null ||
    { $sudo apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "$@" >/dev/null; }
}

if ! command -v kcat >/dev/null 2>&1 && ! command -v kafkacat >/dev/null 2>&1; then
  apt_install kcat
fi

if ! /usr/bin/python3 -c 'import psycopg2' >/dev/null 2>&1; then
  apt_install python3-psycopg2
fi
if [ ! -f /usr/share/java/postgresql.jar ]; then
  apt_install libpostgresql-jdbc-java
fi
if ! command -v javac >/dev/null 2>&1; then
  apt_install openjdk-17-jdk-headless
fi

if [ ! -d "$root/tools/interop/node_modules/amqplib" ] || [ ! -d "$root/tools/interop/node_modules/pg" ]; then
  command -v npm >/dev/null 2>&1 || { echo "tools: npm is missing: install Node.js 18 or newer" >&2; exit 1; }
  echo "tools: installing amqplib and pg into tools/interop" >&2
  (cd "$root/tools/interop" && npm ci --no-audit --no-fund --silent)
fi
