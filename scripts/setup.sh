#!/usr/bin/env bash
# Idempotent set-up for the tests. torch 2.13.0 goes in first (`install-torch.sh`: the CPU build on a machine
# without an NVIDIA driver), so that nothing later pulls a CUDA build; then this package with its test extra (pytest, ruff, import-linter,
# build, twine, check-jsonschema: everything scripts/test.sh runs), then the accelerate releases the
# tests cover (scripts/releases.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${AIF_VENV:-.venv}
PY=$VENV/bin/python
RELEASES=${AIF_RELEASES:-$(grep -v "^#" scripts/releases.txt | tr "\n" " ")}

. scripts/install-torch.sh
# A venv WITHOUT this package, for tests/jobs/test_upstream_patches.py: accelerate patched from source
# (patches/) must be proven on its own, with no start-up hook and nothing importable from here. Its torch
# goes in beside this venv's (about a minute each, one core each).
UPSTREAM_VENV=${AIF_UPSTREAM_VENV:-.venv-upstream}
UPY=$UPSTREAM_VENV/bin/python
if [ "${AIF_SETUP_JOBS:-1}" != 0 ]; then
  ( [ -x "$UPY" ] || python3 -m venv "$UPSTREAM_VENV"; install_torch "$UPY" ) &
  upstream_torch=$!
fi
[ -x "$PY" ] || python3 -m venv "$VENV"
install_torch "$PY"
# Re-run every time: the editable install copies the start-up hook (.pth + module) into the venv, and
# the copy must follow the source. tests/conftest.py keeps that hook off for all but its own tests.
"$PY" -m pip install -q --disable-pip-version-check -e ".[test]"

# AIF_SETUP_JOBS=0: only what the lint and the unit tier need (CI's lint + unit job); the rest is the job tier's.
[ "${AIF_SETUP_JOBS:-1}" = 0 ] && exit 0

# Each release in a folder of its own, put in front of sys.path by the tests (PYTHONPATH).
for v in $RELEASES; do
  dest=.cache/accelerate/$v
  [ -f "$dest/.complete" ] && continue
  rm -rf "$dest"
  "$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$dest" "accelerate==$v"
  touch "$dest/.complete"
done

# The sdists hold each release's own tests/ (accelerate's test_logging.py runs against the patch).
mkdir -p .cache/sdist
for v in $RELEASES; do
  ls .cache/sdist/accelerate-"$v".tar.gz >/dev/null 2>&1 && continue
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: --no-build-isolation \
    -d .cache/sdist "accelerate==$v" 2>/dev/null || \
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: -d .cache/sdist "accelerate==$v"
done

# The venv without this package: accelerate's own dependencies, not accelerate itself (the patched copy
# comes first on PYTHONPATH).
wait "$upstream_torch"
# ruff: the pin of accelerate's `make quality` (setup.py, extras["quality"]), run on the patches.
"$UPY" -m pip install -q --disable-pip-version-check pytest setuptools wheel ruff==0.13.1 \
  numpy packaging psutil pyyaml huggingface_hub safetensors
