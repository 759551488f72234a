#!/usr/bin/env bash
# Quick start, second command: install what the build needs when something is missing (once),
# build, then run the whole test suite through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
full=${SHARDPLAN_FULL_CHECKS:-1}
# Each phase's wall time on stderr, so a run's log shows where its minutes went.
phase_start=$SECONDS
phase_done() { echo "test.sh: $1 took $((SECONDS - phase_start)) s" >&2; phase_start=$SECONDS; }
python_deps=(python3-venv python3-dev) # the Python package's venv and headers
if [[ "$full" == 1 ]]; then
  scripts/install-deps.sh clang libclang-rt-14-dev clang-format-14 clang-tidy-14 universal-ctags chromium "${python_deps[@]}" # clang: the sanitizer and fuzz builds' compiler; clang-format-14, universal-ctags: style::clang_format, style::long functions say why; clang-tidy-14: the clang-tidy phase; chromium: the memory chart rendered in a browser
else
  scripts/install-deps.sh "${python_deps[@]}"
fi
phase_done "installing packages"
# The frameworks that check what the planner emits (torch, transformers, torchtitan, DeepSpeed from
# PyPI; then llm-foundry in a venv of its own, its pins being its own; scripts/frameworks-env.sh),
# installed one after the other beside the build; the full checks need them, so a venv that
# cannot be made fails the run. Their tests run with the venvs' interpreters.
frameworks=build/frameworks
foundry=build/llm-foundry
framework_python=()
if [[ "$full" == 1 ]]; then
  (scripts/frameworks-env.sh "$frameworks" &&
    scripts/frameworks-env.sh "$foundry" validation/requirements-llm-foundry.txt "llmfoundry, composer") &
  frameworks_pid=$!
  for v in SHARDPLAN_TORCH_PYTHON SHARDPLAN_TORCHTITAN_PYTHON SHARDPLAN_DEEPSPEED_PYTHON; do
    framework_python+=("-D$v=$PWD/$frameworks/bin/python")
  done
  framework_python+=("-DSHARDPLAN_LLM_FOUNDRY_PYTHON=$PWD/$foundry/bin/python")
fi
# The Python package (python/) builds in the release tree when its venv can be made (nanobind and
# pytest from PyPI); ctest then runs its pytest suite (tests/python). Without PyPI it is skipped.
venv=build/pyvenv
if scripts/python-env.sh "$venv"; then
  cmake --preset release -DSHARDPLAN_PYTHON=ON -DPython_EXECUTABLE="$PWD/$venv/bin/python" \
    -Dnanobind_DIR="$("$venv/bin/python" -m nanobind --cmake_dir)" "${framework_python[@]}" >/dev/null
else
  echo "test.sh: skipping the Python package's tests (see the line above)" >&2
  cmake --preset release -DSHARDPLAN_PYTHON=OFF "${framework_python[@]}" >/dev/null
fi
phase_done "the Python package's venv and configuring"
scripts/build.sh
phase_done "the release build"
if [[ "$full" == 1 ]]; then
  wait "$frameworks_pid" || { echo "test.sh: the frameworks' venvs are needed by the full checks" >&2; exit 1; }
  phase_done "the frameworks' venvs (beside the build)"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --preset release -j "$(nproc)"
phase_done "the release tests"
# clang-tidy 14 over the translation units of the release tree (any finding fails the run), but
# those .ci/tidy-clean records as checked clean with exactly their present inputs (scripts/tidy.py:
# clang-tidy's and the system headers' versions, .clang-tidy, the compile arguments, the unit and
# every project header it reaches); scripts/tidy.sh --record rewrites the record.
if [[ "$full" == 1 ]]; then
  scripts/tidy.sh "$(nproc)"
  phase_done "clang-tidy"
fi
# Then the suite again under AddressSanitizer and UndefinedBehaviorSanitizer (build/sanitize), and
# every document parser fuzzed from that same build for FUZZ_SECONDS each. SHARDPLAN_FULL_CHECKS=0
# skips both (the release suite alone, for a quick check while editing).
if [[ "$full" == 1 ]]; then
  scripts/sanitize.sh
  phase_done "the sanitizer build and tests"
  FUZZ_SECONDS="${FUZZ_SECONDS:-10}" scripts/fuzz.sh
  phase_done "fuzzing"
fi
