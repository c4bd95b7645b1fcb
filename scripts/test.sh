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
exec .venv/bin/python -m pytest -m alone -n 0
