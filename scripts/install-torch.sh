#!/usr/bin/env bash
# Put torch 2.13.0 into the venv of the Python named by $1, unless it is there already. Sourced by
# setup.sh and demo.sh; torch goes in first, so nothing later pulls a build of its own choosing.
#
# Which build: AIF_TORCH_INDEX=URL takes torch from that index; AIF_TORCH_INDEX=default takes pip's own
# (on a stock Linux index, the CUDA build: gigabytes). Unset: torch's CPU index on a machine without an
# NVIDIA driver (no `nvidia-smi`), pip's own otherwise. Whatever pip is set up to find besides (a
# find-links folder, a mirror) still counts: pip takes the CPU wheel from there when the index is out of reach.
install_torch() {
  local py=$1 index=${AIF_TORCH_INDEX:-}
  if "$py" -c 'import sys, torch; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
    return 0
  fi
  if [ -z "$index" ]; then
    command -v nvidia-smi >/dev/null 2>&1 && index=default || index=https://download.pytorch.org/whl/cpu
  fi
  if [ "$index" = default ]; then
    "$py" -m pip install -q --disable-pip-version-check torch==2.13.0
  else
    "$py" -m pip install -q --disable-pip-version-check --retries 0 --index-url "$index" torch==2.13.0 2>&1 |
      grep -v -e "^WARNING: Retrying" -e "Failed to establish a new connection" >&2 || true
    "$py" -c 'import torch' 2>/dev/null || { echo "install-torch: torch 2.13.0 did not install from $index" >&2; return 1; }
  fi
}
