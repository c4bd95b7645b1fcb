#!/usr/bin/env bash
# The test command: lint, then every test (unit and integration on real services).
# pytest's "no tests collected" exits 5, which fails this script like any other failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"
