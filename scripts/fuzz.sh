#!/usr/bin/env bash
# Fuzzes every document parser: builds the libFuzzer targets of tests/fuzz (the `fuzz` preset:
# clang, AddressSanitizer and UndefinedBehaviorSanitizer, the libraries instrumented too, in the
# sanitize preset's folder build/sanitize, so that after scripts/sanitize.sh nothing is compiled
# again), replays the kept regression inputs (tests/fuzz/regressions/, ctest's `fuzz` preset), then
# runs each target for FUZZ_SECONDS (default 30; FUZZ_JOBS targets at a time, default the CPUs)
# from a seed corpus copied from the shipped documents. Any crash, leak, sanitizer report or
# escaped exception fails the script; the inputs that did are left under build/sanitize/artifacts/.
#   FUZZ_SECONDS=20 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-30}
build=build/sanitize # the fuzz preset's folder
jobs=${FUZZ_JOBS:-$(nproc)}

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$jobs"
ctest --preset fuzz

export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export SHARDPLAN_DATA_DIR=$PWD

# Seeds: copied from the shipped documents at every run (never kept in git), plus the job, sharding
# and plan documents the project's own writers produce.
generated="$build/seeds/generated"
rm -rf "$build/seeds"
"$build/tests/fuzz/fuzz_seed_writer" "$generated"
shipped_json=(examples/models/*/config.json hardware_profiles/*.json)
while IFS= read -r f; do shipped_json+=("$f"); done < <(find examples -name '*.json' -not -path 'examples/models/*' | sort)
declare -A own=(
  [fuzz_hf_config]="examples/models/*/config.json"
  [fuzz_hardware]="hardware_profiles/*.json"
  [fuzz_job]="$generated/job/*.json"
  [fuzz_sharding]="$generated/sharding/*.json"
  [fuzz_plan]="$generated/plan/*.json"
  [fuzz_run_document]="$generated/run/*.json"
  [fuzz_deepspeed_import]="examples/deepspeed/*.json"
  [fuzz_nccl_tests_log]="examples/nccl-tests/* tests/calibrate/data/*.log"
  [fuzz_checkpoint_index]="tests/fuzz/seeds/checkpoint-*.json"
)

# One target: its seeds, then libFuzzer for $seconds; its summary line and exit code are left in
# $build/$target.summary and $build/$target.rc.
fuzz_target() {
  local target=$1
  local binary="$build/tests/fuzz/$target"
  local seeds="$build/seeds/$target" corpus="$build/corpus/$target"
  local artifacts="$build/artifacts/$target" log="$build/$target.log"
  mkdir -p "$seeds" "$corpus" "$artifacts"
  # shellcheck disable=SC2086  # the patterns above are meant to expand here
  cp ${own[$target]} "$seeds"/ 2>/dev/null || true
  local args=()
  if [ "$target" != fuzz_nccl_tests_log ]; then
    local n=0 f
    for f in "${shipped_json[@]}" "$generated"/*/*.json; do cp "$f" "$seeds/any-$((n++))-$(basename "$f")"; done
    args+=(-dict=tests/fuzz/json.dict)
  fi
  local rc=0
  "$binary" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "${args[@]}" "$corpus" "$seeds" >"$log" 2>&1 || rc=$?
  local execs rate
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  printf '%-24s %10s executions  %7s/s  rc %s\n' "$target" "${execs:-?}" "${rate:-?}" "$rc" \
    >"$build/$target.summary"
  echo "$rc" >"$build/$target.rc"
}

# The targets run $jobs at a time (each one process, each for its full $seconds).
targets=()
for target in fuzz_hf_config fuzz_hardware fuzz_job fuzz_sharding fuzz_plan fuzz_run_document \
              fuzz_deepspeed_import fuzz_nccl_tests_log fuzz_checkpoint_index; do
  [ -x "$build/tests/fuzz/$target" ] || continue  # the parser does not exist in this tree
  targets+=("$target")
  rm -f "$build/$target.summary" "$build/$target.rc"
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  fuzz_target "$target" &
done
wait

failed=()
summary=()
for target in "${targets[@]}"; do
  summary+=("$(cat "$build/$target.summary" 2>/dev/null || echo "$target: no result")")
  rc=$(cat "$build/$target.rc" 2>/dev/null || echo 1)
  if [ "$rc" -ne 0 ]; then
    failed+=("$target")
    echo "---- $target failed (rc $rc): last lines of $build/$target.log" >&2
    tail -n 60 "$build/$target.log" >&2
    ls "$build/artifacts/$target" >&2 || true
  fi
done

echo "fuzzing, $seconds s per target:"
printf '  %s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzz: findings in ${failed[*]} (inputs under $build/artifacts/; keep each as a regression)" >&2
  exit 1
fi
