#!/usr/bin/env bash
# The main job: a lean set-up, then a real 4-rank CPU run that shows upstream's in_order bug and the
# fix side by side. Extra arguments go to `check` (e.g. --mode gather, --nproc 2).
#
# It installs only what `check` needs, in a venv of its own (.venv-demo, or AIF_VENV): torch 2.13.0
# (CPU) first, so that nothing later pulls a CUDA build; then one accelerate release (the latest in
# scripts/releases.txt, or AIF_ACCELERATE=1.12.0) and this package, in one pip call. The test
# environment (scripts/setup.sh: every release, their sdists, a second venv) is scripts/test.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${AIF_VENV:-.venv-demo}
PY=$VENV/bin/python
ACCELERATE=${AIF_ACCELERATE:-$(grep -v "^#" scripts/releases.txt | tail -n 1)}
PIP=("$PY" -m pip install -q --disable-pip-version-check)

start=$SECONDS
. scripts/install-torch.sh
[ -x "$PY" ] || python3 -m venv "$VENV"
install_torch "$PY"  # torch==2.13.0, the CPU build on a machine without an NVIDIA driver
# Editable: the demo runs this checkout as it is. Re-run every time (the start-up hook is a copy).
"${PIP[@]}" "accelerate==$ACCELERATE" -e .
echo "demo: set-up took $((SECONDS - start)) s ($VENV: torch 2.13.0, accelerate $ACCELERATE, this package)" >&2
exec "$PY" -m accelerate_inorder_fix check --nproc 4 "$@"
