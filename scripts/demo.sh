#!/usr/bin/env bash
# The main job: set up (idempotent), then a real 4-rank CPU run that shows upstream's in_order bug
# and the fix side by side. Extra arguments go to `check` (e.g. --mode gather, --nproc 2).
# AIF_ACCELERATE=1.12.0 runs it against that release instead of the latest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -n "${AIF_ACCELERATE:-}" ]; then
  export PYTHONPATH=".cache/accelerate/$AIF_ACCELERATE${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "${AIF_VENV:-.venv}/bin/python" -m accelerate_inorder_fix check --nproc 4 "$@"
