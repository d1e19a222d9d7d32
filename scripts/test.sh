#!/usr/bin/env bash
# The test command: set up (idempotent), then the whole suite. Every multi-rank test has a hard
# timeout that kills the job's whole process tree.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${AIF_VENV:-.venv}/bin/python" -m pytest "$@"
