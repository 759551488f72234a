#!/usr/bin/env bash
# The frameworks whose own code checks what the planner emits (torch, transformers, torchtitan and
# DeepSpeed at the versions of validation/requirements.txt, from PyPI): a venv at $1 (default
# build/frameworks), made once and reused. The tests that need them (the emitted FSDP code run
# under torchrun, torchtitan's and DeepSpeed's parsers of the emitted configs) run with its
# interpreter. Exits 1 with one line on stderr when it cannot be made. About 6 GiB on disk (torch
# from PyPI brings its CUDA libraries; the tests run on the CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/frameworks}
check='import torch, transformers, torchtitan, deepspeed'
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
  exit 0
fi
if ! python3 -m venv "$venv" >/dev/null 2>&1; then
  echo "frameworks-env.sh: cannot make a venv at $venv (python3 -m venv failed; is python3-venv installed?)" >&2
  exit 1
fi
if ! "$venv/bin/pip" install -q --disable-pip-version-check --retries 2 --timeout 60 \
  -r validation/requirements.txt >"$venv/install.log" 2>&1; then
  echo "frameworks-env.sh: cannot install validation/requirements.txt from PyPI into $venv (see $venv/install.log)" >&2
  exit 1
fi
if ! "$venv/bin/python" -c "$check" >>"$venv/install.log" 2>&1; then
  echo "frameworks-env.sh: the frameworks installed into $venv do not import (see $venv/install.log)" >&2
  exit 1
fi
