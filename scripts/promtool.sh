#!/usr/bin/env bash
# Run promtool, fetching it from Debian's prometheus package into .cache/ when it is not installed.
# Only the binary is extracted: nothing is installed or started.
set -euo pipefail
if command -v promtool >/dev/null 2>&1; then
  exec promtool "$@"
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/.cache/promtool/usr/bin/promtool"
if [ ! -x "$bin" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1) || {
    echo "promtool: not installed and 'apt-get download prometheus' failed: install the prometheus package" >&2
    exit 1
  }
  mkdir -p "$root/.cache/promtool"
  dpkg -x "$tmp"/prometheus_*.deb "$root/.cache/promtool"
fi
exec "$bin" "$@"
