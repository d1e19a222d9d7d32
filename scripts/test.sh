#!/usr/bin/env bash
# The test command (README's, and CI's through .ci/run): set up (idempotent), the lint (ruff,
# import-linter, mypy --strict; fail fast), then pytest: the whole suite, or what the arguments name
# (`bash scripts/test.sh tests/unit`: the lint and the unit tier, set-up included, without the job tier's
# releases). Every multi-rank test has a hard timeout that kills the job's whole process tree.
set -euo pipefail
cd "$(dirname "$0")/.."
# The unit tier alone needs no accelerate release, sdist or second venv: only torch and this package.
jobs=0
for arg in "${@:-tests}"; do
  case "$arg" in tests/unit | tests/unit/* | -*) ;; *) jobs=1 ;; esac
done
AIF_SETUP_JOBS=${AIF_SETUP_JOBS:-$jobs} bash scripts/setup.sh
BIN=${AIF_VENV:-.venv}/bin
"$BIN/ruff" check .
"$BIN/ruff" format --check .
"$BIN/lint-imports"
# The oldest Python claimed (requires-python): the package, its tests and benchmarks use nothing newer.
"$BIN/vermin" -t=3.9- --no-tips --violations --eval-annotations -q accelerate_inorder_fix tests benchmarks _accelerate_inorder_fix_startup.py
"$BIN/mypy"  # strict, on the package ([tool.mypy] in pyproject.toml)
# What the arguments name: one file after another. The whole suite: the files without a `timed` mark two at a
# time (a job mostly waits: one file after another keeps one core of two busy), then the `timed` files, whose
# jobs are held to bounds in units of T, one after another with nothing beside them.
run() {
  local status=0
  "$BIN/python" -m pytest "$@" || status=$?
  if [ "$status" = 5 ]; then
    echo "scripts/test.sh: pytest collected no test from: $*" >&2
    return 1
  fi
  return "$status"
}
if [ "$#" -gt 0 ]; then
  run "$@"
  exit
fi
status=0
run -m "not timed" -n 2 --dist loadfile tests || status=$?
run -m timed tests || status=$?
exit "$status"
