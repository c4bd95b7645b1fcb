#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian machine with Python 3.11: system packages through apt
# when missing, then a virtualenv in .venv with the pinned stack. Safe to run any number of times.
# --test (scripts/test.sh) also installs what only the tests use: the demo pulls no browser.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
bare=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)   # only to validate docker-compose.yml
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)   # runs Apache Kafka
command -v mvn >/dev/null 2>&1 || missing+=(maven)                       # installs Apache Kafka
command -v ip >/dev/null 2>&1 || missing+=(iproute2)                    # the multi-host tests' namespaces
if [ "${1:-}" = --test ]; then
  # the report's tests open it in headless Chromium through Playwright (no browser download)
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v strace >/dev/null 2>&1 || missing+=(strace)          # a SIGKILL test's exact moment
  command -v h2load >/dev/null 2>&1 || missing+=(nghttp2-client)  # serving's overload tests
  # promtool checks and unit-tests the shipped alert rules; without the package's
  # recommends, which bring exporters that would run as daemons
  command -v promtool >/dev/null 2>&1 || bare+=(prometheus)
fi
if [ ${#missing[@]} -gt 0 ] || [ ${#bare[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]} ${bare[*]} with apt"
  as_root apt-get update -q
  [ ${#missing[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q "${missing[@]}"
  [ ${#bare[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q --no-install-recommends "${bare[@]}"
fi

python=${PYTHON:-}
if [ -z "$python" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      python=$candidate; break
    fi
  done
fi
[ -n "$python" ] || { echo "setup: Python 3.11 is required (Paddle 2.6 wheels); set PYTHON=..." >&2; exit 1; }

[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=.venv/.streamrec-deps
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python dependencies into .venv (first run takes a few minutes)"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e ".[airflow,dev]"
  echo "$want" > "$stamp"
fi
# the pinned Apache Kafka broker (the demo's and the tests'), through Maven into a cache
# folder once (devservices/kafka_broker.py)
.venv/bin/python -m devservices.kafka_broker install >/dev/null
