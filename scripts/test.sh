#!/usr/bin/env bash
# The test command: lint, then every test (unit and integration on real services).
# Without arguments: the suite on several pytest workers, then the tests marked `alone`
# (bars that CPU contention moves) one at a time with the machine to themselves.
# With arguments: pytest with them, as given.
# pytest's "no tests collected" exits 5, which fails this script like any other failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
.venv/bin/python -m pytest -m "not alone"
# the machine to itself: the first run's writes flushed and its processes' work gone (the
# 1-minute load under 1, at most 120 s), so the bars measure the model, not the leftovers
sync
echo "load before the alone tests: $(cut -d' ' -f1-3 /proc/loadavg)"
for _ in $(seq 120); do
    awk '{ exit !($1 < 1.0) }' /proc/loadavg && break
    sleep 1
done
echo "load as they start: $(cut -d' ' -f1-3 /proc/loadavg)"
exec .venv/bin/python -m pytest -m alone -n 0
