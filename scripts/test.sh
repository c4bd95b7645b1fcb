#!/usr/bin/env bash
# The test command: lint, type check, the alert rules' checks and the documentation site's
# build, then every test (unit and integration on real services).
# Without arguments: the tests marked `alone` (bars that CPU contention moves) one at a
# time with the machine to themselves, then the rest on several pytest workers.
# With arguments: pytest with them, as given.
# pytest's "no tests collected" exits 5, which fails this script like any other failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# the shipped alert rules are valid, and each fires where its unit test says
promtool check rules deploy/prometheus/streamrec-alerts.yml
promtool test rules deploy/prometheus/streamrec-alerts.test.yml
promtool check config deploy/prometheus/prometheus.yml
# --strict: a broken link, a page missing from the nav or a reference that does not resolve
# fails (the configuration and CLI references are generated from the code at build)
NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true .venv/bin/mkdocs build --strict --quiet --site-dir var/site
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
# the tests marked `alone` first, before anything else has loaded the machine (after the
# parallel run their bar failed 2 CI runs in 4, 3 runs in 25 otherwise: tests/README.md);
# both phases always run, and the command fails if either does
status=0
.venv/bin/python -m pytest -m alone -n 0 || status=$?
.venv/bin/python -m pytest -m "not alone" || status=$?
exit "$status"
