#!/usr/bin/env bash
# The Python environment the package's tests build and run in: a venv at $1 (default build/pyvenv)
# with nanobind 3.1.0 and pytest 9.2.0 from PyPI (the versions the tests were run with), made once
# and reused. Exits 1 with one line on stderr when it cannot be made (no python3-venv, or PyPI out
# of reach); scripts/test.sh then skips the tests.
set -uo pipefail
cd "$(dirname "$0")/.."
venv=${1:-build/pyvenv}
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "import nanobind, pytest" 2>/dev/null; then
  exit 0
fi
if ! python3 -m venv "$venv" >/dev/null 2>&1; then
  echo "python-env.sh: cannot make a venv at $venv (python3 -m venv failed; is python3-venv installed?)" >&2
  exit 1
fi
if ! "$venv/bin/pip" install -q --disable-pip-version-check --retries 1 --timeout 20 nanobind==3.1.0 pytest==9.2.0 >/dev/null 2>&1; then
  echo "python-env.sh: cannot install nanobind and pytest from PyPI into $venv" >&2
  exit 1
fi
