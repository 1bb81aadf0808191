#!/usr/bin/env bash
# scripts/browser.sh — make sure a headless Chromium is here for the console's browser tests
# (integration/console/browser_test.go and integration/demo_console_test.go, driven by chromedp
# through integration/internal/browsertest). Idempotent: it installs Debian's `chromium`
# with apt-get only when no usable browser is found, then proves it renders a page headless.
#
#   scripts/browser.sh            install if missing, then check (what `make test` and CI call)
#   scripts/browser.sh --check    check only; exit 1 when missing
#
# The tests find the browser as this script does: $OUTBOXKIT_CHROMIUM, else `chromium` on PATH.
# Exit codes: 0 ready, 1 missing or broken, 2 cannot install here (not root, no sudo, not Debian).
set -euo pipefail

check_only=false
[[ "${1:-}" == "--check" ]] && check_only=true

find_browser() {
  if [[ -n "${OUTBOXKIT_CHROMIUM:-}" ]]; then
    command -v "$OUTBOXKIT_CHROMIUM" || true
    return
  fi
  command -v chromium || true
}

# The flags the tests pass. --no-sandbox: CI runs as root in a container, where Chromium's
# sandbox needs user namespaces it rarely has. A fresh --user-data-dir per run: no profile,
# cache or cookie leaks from one run into the next.
FLAGS=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run
       --disable-background-networking --disable-component-update --disable-sync
       --disable-dev-shm-usage)

smoke() {
  local bin=$1 dir out
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' RETURN
  # --dump-dom renders the page and prints the DOM after scripts ran: proof that Blink and V8
  # work, with no network (a data: URL).
  out=$(timeout 60 "$bin" "${FLAGS[@]}" --user-data-dir="$dir" --dump-dom \
    'data:text/html,<p id=p></p><script>document.getElementById("p").textContent="headless "+(1+1)</script>' \
    2>"$dir/stderr" || true)
  if [[ "$out" != *'headless 2'* ]]; then
    echo "browser.sh: $bin did not render a page headless. Its stderr:" >&2
    tail -20 "$dir/stderr" >&2
    return 1
  fi
}

bin=$(find_browser)
if [[ -z "$bin" ]]; then
  if $check_only; then
    echo "browser.sh: no chromium found (set OUTBOXKIT_CHROMIUM or run scripts/browser.sh)" >&2
    exit 1
  fi
  if ! command -v apt-get >/dev/null; then
    echo "browser.sh: no chromium and no apt-get: install Chromium or Chrome yourself and set OUTBOXKIT_CHROMIUM" >&2
    exit 2
  fi
  SUDO=()
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      SUDO=(sudo -n)
    else
      echo "browser.sh: chromium is missing and installing it needs root: run  sudo apt-get install -y chromium" >&2
      exit 2
    fi
  fi
  echo "browser.sh: installing chromium with apt-get…"
  # Update the index only when the package is unknown to it (a fresh container has no lists).
  if ! apt-cache show chromium >/dev/null 2>&1; then
    "${SUDO[@]}" apt-get update -qq
  fi
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
  bin=$(find_browser)
  [[ -n "$bin" ]] || { echo "browser.sh: apt-get ran but chromium is still not on PATH" >&2; exit 1; }
fi

smoke "$bin"
echo "browser.sh: ready: $("$bin" --version 2>/dev/null | head -1) at $bin"
