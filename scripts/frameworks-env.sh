#!/usr/bin/env bash
# The frameworks whose own code checks what the planner emits, from PyPI at the versions of a
# requirements file: a venv at $1, made once and reused, whose interpreter runs the tests that need
# them. By default build/frameworks with validation/requirements.txt (torch, transformers,
# torchtitan, DeepSpeed: the emitted FSDP code run under torchrun, torchtitan's and DeepSpeed's
# parsers of the emitted configs); `scripts/frameworks-env.sh build/llm-foundry
# validation/requirements-llm-foundry.txt llmfoundry` makes llm-foundry's (its pins are its own:
# torch 2.7.0), whose config code reads the emitted YAML. $3: the modules that must import. Exits 1
# with one line on stderr when it cannot be made. Each is about 6-7 GiB on disk (torch from PyPI
# brings its CUDA libraries; the tests run on the CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/frameworks}
requirements=${2:-validation/requirements.txt}
check="import ${3:-torch, transformers, torchtitan, deepspeed}"
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
  exit 0
fi
if ! python3 -m venv "$venv" >/dev/null 2>&1; then
  echo "frameworks-env.sh: cannot make a venv at $venv (python3 -m venv failed; is python3-venv installed?)" >&2
  exit 1
fi
if ! "$venv/bin/pip" install -q --disable-pip-version-check --retries 2 --timeout 60 \
  -r "$requirements" >"$venv/install.log" 2>&1; then
  echo "frameworks-env.sh: cannot install $requirements from PyPI into $venv (see $venv/install.log)" >&2
  exit 1
fi
if ! "$venv/bin/python" -c "$check" >>"$venv/install.log" 2>&1; then
  echo "frameworks-env.sh: the frameworks installed into $venv do not import (see $venv/install.log)" >&2
  exit 1
fi
