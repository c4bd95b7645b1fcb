#!/usr/bin/env bash
# The main job: the whole loop locally on embedded services (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/streamrec demo "$@"
