#!/usr/bin/env bash
# One command that checks the GPU backend on a machine with one or more NVIDIA GPUs, and its
# preparation on a machine that has the build's libraries:
#
#   scripts/gpu_check.sh --prepare [DIR]       copies the header-only libraries the build needs
#                                              (nlohmann_json, CLI11, fmt, Eigen, doctest) into DIR
#                                              (default .gpu-deps), which then travels with the tree
#   scripts/gpu_check.sh [--deps DIR] LOGDIR   on the GPU machine: configure and build against DIR
#                                              (cmake/PreparedDeps.cmake) and the NCCL of Python's
#                                              nvidia-nccl package, run the GPU tests (ctest -L gpu),
#                                              calibrate the GPUs present (NCCL collectives, cuBLAS
#                                              GEMMs, copy bandwidth), then for ddp, zero2, zero3
#                                              and fsdp-full: run a one-GPU plan for real with a
#                                              one-rank NCCL communicator, plan an 8-GPU job for
#                                              that profile, rehearse its rank 0 on GPU 0 with the
#                                              CUDA executor, and `planner validate` it
#
# The GPU machine needs the CUDA toolkit (nvcc, cuBLAS), CMake >= 3.25, ninja, python3 and NCCL
# (SHARDPLAN_NCCL_ROOT or NCCL_ROOT, else the folder of Python's nvidia.nccl); no MPI, no package
# manager, no network. The model is llama-2-7b at full width (hidden 4096, 32 heads, MLP 11008,
# vocabulary 32000) with 4 blocks, in bf16-mixed (bf16 GEMMs with fp32 accumulation, fp32
# master weights; PRECISION=fp32 runs TF32 GEMMs instead) with flash attention, sequences of
# 1024 tokens, 2 per micro-batch: a step takes a fraction of a second.
# It ends with one table (also LOGDIR/table.txt): per strategy the predicted and measured peak
# memory and step time, the prediction's error ((predicted - measured) / measured, as `planner
# validate` reports it) and the MFU of the measured step. Every command's output is in LOGDIR;
# a failing step ends the script with one line naming it and its log. Few sweep sizes and
# iterations, short runs; on one H200 (16 cores) the parts took: configure and build 57-74 s, the
# GPU tests 46 s (CTEST_PARALLEL_LEVEL=6), calibration 3 s, a real one-GPU run 46 s (ddp) and
# 103 s (zero2), most of it the executor's start, a rehearsal 6-48 s: about 8 minutes in all.
#
# Environment: BUILD_DIR (default build/gpu-check), STEPS (executor steps, default 8; the times
# are medians of steps 2..STEPS), PRECISION (default bf16-mixed; fp32, fp16-mixed),
# CUDA_ARCHITECTURES (default: the GPUs' own, from nvidia-smi),
# EXTRA_CMAKE_ARGS (more configure arguments, split at spaces).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEFAULT_DEPS=$ROOT/.gpu-deps
STRATEGIES=(ddp zero2 zero3 fsdp-full)
LAYERS=4 SEQ=1024 MICRO_BATCH=2 GLOBAL_BATCH=16 PLAN_GPUS=8
STEPS=${STEPS:-8}
PRECISION=${PRECISION:-bf16-mixed}

usage() {
  cat <<EOF
usage: scripts/gpu_check.sh --prepare [DIR]       (default DIR: .gpu-deps)
       scripts/gpu_check.sh [--deps DIR] LOGDIR
EOF
}

die() {
  echo "gpu_check: $*" >&2
  [[ -n ${LOG:-} && -d ${LOG:-} ]] && echo "gpu_check: $*" >> "$LOG/gpu_check.log"
  exit 1
}

# ---------------------------------------------------------------------------------------------
# --prepare: the header-only libraries, as the system's packages installed them.

# The first of the folders that holds `relative` (a file under an include folder).
find_under() {
  local relative=$1 folder
  shift
  for folder in "$@"; do
    if [[ -e $folder/$relative ]]; then
      echo "$folder"
      return 0
    fi
  done
  return 1
}

# "package version" of the package that installed `file`, or "(not from a package)".
package_of() {
  local file=$1 package version
  if command -v dpkg-query > /dev/null &&
     package=$(dpkg-query -S "$(readlink -f "$file")" 2> /dev/null | head -n 1 | cut -d: -f1) &&
     [[ -n $package ]]; then
    version=$(dpkg-query -W -f='${Version}' "$package" 2> /dev/null || echo "?")
    echo "$package $version"
  else
    echo "(not from a package)"
  fi
}

prepare() {
  local dir=$1
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  local include=$dir/include
  local readme_rows=() packages=()
  mkdir -p "$include" "$dir/cmake" "$dir/licenses"
  # name, the folder copied (under an include folder), a file that must be in it, where to look
  local specs=(
    "nlohmann_json|nlohmann|nlohmann/json.hpp|/usr/include /usr/local/include"
    "CLI11|CLI|CLI/CLI.hpp|/usr/include /usr/local/include"
    "fmt|fmt|fmt/format-inl.h|/usr/include /usr/local/include"
    "Eigen3|Eigen|Eigen/Dense|/usr/include/eigen3 /usr/local/include/eigen3"
    "doctest|doctest|doctest/doctest.h|/usr/include /usr/local/include"
  )
  local spec name folder marker places from package
  for spec in "${specs[@]}"; do
    IFS='|' read -r name folder marker places <<< "$spec"
    # shellcheck disable=SC2086 # places is a list of folders
    from=$(find_under "$marker" $places) ||
      die "--prepare: $name not found (no $marker under $places); install its package first"
    rm -rf "${include:?}/$folder"
    cp -RL "$from/$folder" "$include/$folder"
    package=$(package_of "$from/$marker")
    packages+=("${package%% *}")
    readme_rows+=("$(printf '  %-14s include/%-10s from %-28s %s' "$name" "$folder/" "$from/$folder" "$package")")
  done
  # doctest_discover_tests (include(doctest) in tests/CMakeLists.txt)
  local cmake_folder
  cmake_folder=$(find_under doctest.cmake /usr/lib/cmake/doctest /usr/local/lib/cmake/doctest \
    /usr/lib/*/cmake/doctest /usr/share/doctest/cmake) ||
    die "--prepare: doctest's CMake scripts (doctest.cmake) not found"
  cp -L "$cmake_folder/doctest.cmake" "$cmake_folder/doctestAddTests.cmake" "$dir/cmake/"
  readme_rows+=("$(printf '  %-14s cmake/%-12s from %s' doctest "" "$cmake_folder (doctest.cmake, doctestAddTests.cmake)")")
  # The packages' copyright files go with the copies.
  for package in "${packages[@]}"; do
    if [[ -f /usr/share/doc/$package/copyright ]]; then
      cp "/usr/share/doc/$package/copyright" "$dir/licenses/$package"
    fi
  done
  {
    echo "Header-only libraries for building shardplan on a machine without a package manager"
    echo "(cmake -DSHARDPLAN_DEPS_DIR=<this folder>; scripts/gpu_check.sh does it). fmt is used in"
    echo "its header-only mode (FMT_HEADER_ONLY), so no compiled library is needed."
    echo
    echo "Copied by scripts/gpu_check.sh --prepare on $(date -u +%Y-%m-%dT%H:%M:%SZ) from host $(hostname):"
    printf '%s\n' "${readme_rows[@]}"
    echo
    echo "licenses/ holds each package's copyright file."
  } > "$dir/README"
  echo "prepared $dir ($(du -sh "$dir" | cut -f1)):"
  printf '%s\n' "${readme_rows[@]}"
}

# ---------------------------------------------------------------------------------------------
# The check on the GPU machine.

LOG= # set by main
FAILED=()

note() {
  echo "$*"
  echo "$*" >> "$LOG/gpu_check.log"
}

# step NAME LOGFILE COMMAND...: runs COMMAND with its output in LOGDIR/LOGFILE; a failure ends the
# script with one line (the step, its exit code, the last line of its log, the log's path).
step() {
  local name=$1 log=$LOG/$2 start=$SECONDS rc=0
  shift 2
  "$@" > "$log" 2>&1 || rc=$?
  if ((rc != 0)); then
    echo "== $name: FAILED (exit $rc) after $((SECONDS - start)) s" >> "$LOG/gpu_check.log"
    die "$name failed (exit $rc): $(last_line "$log") [log: $log]"
  fi
  note "== $name: done in $((SECONDS - start)) s"
}

# Like step, but a failure is remembered and the check goes on (the final line names it).
soft_step() {
  local name=$1 log=$LOG/$2 start=$SECONDS rc=0
  shift 2
  "$@" > "$log" 2>&1 || rc=$?
  if ((rc != 0)); then
    note "== $name: FAILED (exit $rc) after $((SECONDS - start)) s: $(last_line "$log") [log: $log]"
    FAILED+=("$name")
    return 1
  fi
  note "== $name: done in $((SECONDS - start)) s"
}

last_line() {
  local line
  line=$(grep -v '^[[:space:]]*$' "$1" 2> /dev/null | tail -n 1 | cut -c1-300 || true)
  echo "${line:-no output}"
}

# to_file FILE COMMAND...: COMMAND's standard output into FILE (its standard error stays).
to_file() {
  local file=$1
  shift
  "$@" > "$file"
}

# A time limit per command where coreutils' timeout exists (a hang is then a failing step).
limited() {
  local seconds=$1
  shift
  if command -v timeout > /dev/null; then
    timeout --kill-after=10 "$seconds" "$@"
  else
    "$@"
  fi
}

find_nccl() {
  local root=${SHARDPLAN_NCCL_ROOT:-${NCCL_ROOT:-}}
  if [[ -z $root ]]; then
    # nvidia.nccl may be a namespace package (no __file__): its __path__ names the folder.
    root=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2> /dev/null) ||
      die "NCCL not found: set SHARDPLAN_NCCL_ROOT (a folder with include/nccl.h and lib/libnccl.so.2) or install Python's nvidia-nccl package"
  fi
  [[ -f $root/include/nccl.h ]] || die "NCCL at $root: no include/nccl.h"
  compgen -G "$root/lib/libnccl.so*" > /dev/null || die "NCCL at $root: no lib/libnccl.so*"
  echo "$root"
}

# The GPUs' compute capabilities as CMake architectures ("9.0" -> "90"), each once.
gpu_architectures() {
  nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null | tr -d ' .' |
    grep -E '^[0-9]+$' | sort -u | paste -sd';' -
}

# One row per strategy from the validate and run documents, and the calibrated profile; the table
# on standard output.
print_table() {
  python3 - "$LOG" "$ROOT/hardware_profiles" "$PRECISION" "${STRATEGIES[@]}" <<'EOF'
import glob, json, os, sys
log, profiles, precision, strategies = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
# The GEMMs' type under the run's precision: bf16 or fp16 autocast, TF32 for fp32.
dtype = {"bf16-mixed": "bf16", "bf16": "bf16", "fp16-mixed": "fp16"}.get(precision, "tf32")

# The datasheet's dense peak of the GEMMs' type on the device the runs name (the built-in profile
# whose gpu.name is the CUDA device's name), for MFU against the datasheet as the goals state it.
def datasheet_peak(device):
    for path in glob.glob(os.path.join(profiles, "*.json")):
        gpu = json.load(open(path)).get("gpu", {})
        if gpu.get("name") == device:
            return gpu.get("peak_TFLOPs", {}).get(dtype), os.path.basename(path)
    return None, None

def load(name):
    path = os.path.join(log, name)
    return json.load(open(path)) if os.path.exists(path) else None

def pct(x):
    return "n/a" if x is None else f"{100 * x:+.1f}%"

profile = load("calibrated.json") or {}
measured_peak = profile.get("gpu", {}).get("peak_TFLOPs", {}).get(dtype)
rows = [f"{'strategy':<10} {'pred peak':>10} {'meas peak':>10} {'error':>8} {'pred step':>10} "
        f"{'meas step':>10} {'error':>8} {'MFU':>7} {'TFLOP/s':>8}",
        f"{'':<10} {'GiB':>10} {'GiB':>10} {'':>8} {'ms':>10} {'ms':>10} {'':>8} {'':>7} {'':>8}"]
sources = set()
for s in strategies:
    v, run = load(f"validate-{s}.json"), load(f"run-{s}.json")
    if v is None or run is None:
        rows.append(f"{s:<10} FAILED (see {log}/gpu_check.log)")
        continue
    m, t = v["memory"], v["time"]
    time = run.get("summary", {}).get("time", {})
    achieved, mfu = time.get("achieved_TFLOPs"), None
    datasheet, profile_name = datasheet_peak(run.get("environment", {}).get("device"))
    if achieved is not None and datasheet:
        mfu = achieved / datasheet
        sources.add(f"MFU: model FLOPs per step / step time / the datasheet's dense {dtype} "
                    f"peak ({datasheet} TFLOP/s, hardware_profiles/{profile_name})")
    elif achieved is not None and measured_peak:
        # MFU = model FLOPs per step / (step time x peak) per GPU (costmodel/simulator.cpp),
        # against the calibrated profile's peak: its best measured GEMM rate of that type.
        mfu = achieved / measured_peak
        sources.add(f"MFU: achieved TFLOP/s / the profile's {dtype} peak ({measured_peak:.1f} "
                    f"TFLOP/s, the best measured {dtype} GEMM)")
    rows.append(f"{s:<10} {m['peak_predicted_bytes'] / 2**30:>10.2f} {m['peak_measured_bytes'] / 2**30:>10.2f} "
                f"{pct(m['peak_rel_error']):>8} {1e3 * t['step_predicted_s']:>10.1f} "
                f"{1e3 * t['step_measured_s']:>10.1f} {pct(t['step_rel_error']):>8} "
                f"{'n/a' if mfu is None else f'{100 * mfu:.1f}%':>7} "
                f"{'n/a' if achieved is None else f'{achieved:.1f}':>8}")
print("\n".join(rows))
print("error: (predicted - measured) / measured, as planner validate reports it")
for source in sorted(sources):
    print(source)
EOF
}

check() {
  local deps=$1
  [[ -d $deps/include ]] || die "no prepared libraries in $deps: run scripts/gpu_check.sh --prepare $deps on a machine that has them, and bring the folder along"
  deps=$(cd "$deps" && pwd)
  local build=${BUILD_DIR:-$ROOT/build/gpu-check}
  export SHARDPLAN_DATA_DIR=$ROOT
  : > "$LOG/gpu_check.log"
  note "gpu_check: logs in $LOG"

  # The machine.
  command -v cmake > /dev/null || die "cmake not found"
  command -v ninja > /dev/null || die "ninja not found"
  command -v python3 > /dev/null || die "python3 not found (it finds NCCL and reads the documents)"
  command -v nvidia-smi > /dev/null || die "nvidia-smi not found: is this a machine with NVIDIA GPUs?"
  local nvcc=${CUDACXX:-}
  [[ -z $nvcc ]] && nvcc=$(command -v nvcc || true)
  [[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
  [[ -n $nvcc ]] || die "nvcc not found (set CUDACXX or put the CUDA toolkit's bin on PATH)"
  local gpus
  gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2> /dev/null | wc -l)
  ((gpus > 0)) || die "nvidia-smi lists no GPU"
  local nccl architectures
  nccl=$(find_nccl)
  export LD_LIBRARY_PATH=$nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  architectures=${CUDA_ARCHITECTURES:-$(gpu_architectures)}
  architectures=${architectures:-80;90}
  {
    nvidia-smi
    "$nvcc" --version
    cmake --version | head -n 1
    echo "ninja $(ninja --version)"
    echo "NCCL: $nccl"
    echo "CUDA architectures: $architectures"
    echo "prepared libraries: $deps"
    cat "$deps/README" 2> /dev/null || true
  } > "$LOG/environment.txt" 2>&1
  note "== $gpus GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | sed 's/^ *//' | paste -sd, -);" \
       "nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'); architectures $architectures; NCCL from $nccl"

  # Build what the check runs: the three programs and the GPU tests' executables.
  # shellcheck disable=SC2086 # EXTRA_CMAKE_ARGS: one argument per word
  step "configure" configure.log cmake -S "$ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DSHARDPLAN_DEPS_DIR="$deps" -DSHARDPLAN_NCCL_ROOT="$nccl" -DCMAKE_CUDA_COMPILER="$nvcc" \
    "-DCMAKE_CUDA_ARCHITECTURES=$architectures" -DSHARDPLAN_BUILD_BENCH=OFF ${EXTRA_CMAKE_ARGS:-}
  if grep -E "shardplan: skipped:.*(CUDA \(|NCCL \()" "$LOG/configure.log" > /dev/null; then
    die "configure did not find CUDA or NCCL: $(grep 'shardplan: skipped:' "$LOG/configure.log") [log: $LOG/configure.log]"
  fi
  # shardplan_gpu_tests: what the tests labelled gpu run (tests/CMakeLists.txt).
  step "build" build.log cmake --build "$build" -j "$(nproc)" --target calibrate/calibrate \
    planner/planner executor/executor shardplan_gpu_tests
  local planner=$build/planner/planner calibrate=$build/calibrate/calibrate
  local executor=$build/executor/executor

  # The GPU tests (each skips with "no CUDA device" where it sees none).
  soft_step "ctest -L gpu" ctest-gpu.log limited 600 ctest --test-dir "$build" -L gpu \
    --output-on-failure || true
  note "   $(grep -E 'tests passed|tests failed' "$LOG/ctest-gpu.log" | tail -n 1)"
  if grep -q '\*\*\*Skipped' "$LOG/ctest-gpu.log"; then
    note "   skipped (no device seen): $(grep -c '\*\*\*Skipped' "$LOG/ctest-gpu.log") test(s), see ctest-gpu.log"
  fi

  # The model, and the profile of the GPUs present: collectives, GEMMs at the model's block shapes
  # and tokens per micro-batch, copy bandwidth. One process per GPU; a few sizes and iterations.
  cd "$LOG"
  step "scaled model" scale-config.log "$executor" scale-config --model llama-2-7b --layers $LAYERS \
    --hidden 4096 --heads 32 --intermediate 11008 --vocab 32000 --out model.json
  local calibrate_args=(--backend nccl --min-bytes 256 --max-bytes 64M --factor 4 --warmup 2 --iters 10
    --gemm-model model.json --gemm-tokens $((SEQ * MICRO_BATCH)) --attention-seq "$SEQ" --timeout-s 120
    --out calibrated.json --accept-poor-fit)  # a short sweep: its fit errors are in the log
  if ((gpus > 1)) && command -v torchrun > /dev/null; then
    # When torchrun's agent keeps its store on MASTER_PORT it says so
    # (TORCHELASTIC_USE_AGENT_STORE=True) and the ranks exchange NCCL's id on the next port
    # (comm/launch_env.hpp).
    step "calibrate on $gpus GPUs (torchrun)" calibrate.log limited 300 torchrun --standalone \
      --nproc_per_node "$gpus" --no_python "$calibrate" "${calibrate_args[@]}"
  else
    ((gpus > 1)) && note "   torchrun not found: calibrating GPU 0 only"
    step "calibrate on 1 GPU" calibrate.log limited 300 env CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" \
      "$calibrate" "${calibrate_args[@]}"
  fi
  grep -E "^# (compute efficiency|memory copy bandwidth)" calibrate.log | sed 's/^/   /' | tee -a gpu_check.log || true

  # Per strategy: the plan for 8 GPUs of this profile (one node of 8), rank 0 of it rehearsed on
  # GPU 0 (its own shards and buffers; stand-in copies for the collectives), validate.
  local common=(--model model.json --hardware calibrated.json
    --seq-len "$SEQ" --global-batch "$GLOBAL_BATCH" --micro-batch "$MICRO_BATCH" --precision "$PRECISION"
    --attention flash --checkpointing none --offload none --recipe executor)
  local job=("${common[@]}" --gpus "$PLAN_GPUS" --gpus-per-node "$PLAN_GPUS")
  local s
  # Per strategy: the plan for this one GPU, run for real with a one-rank NCCL communicator (its
  # collectives are kernels on NCCL's own streams, so every wait of the engine orders real work).
  # The rank's environment is torchrun's (comm/launch_env.hpp): no MPI is needed.
  for s in "${STRATEGIES[@]}"; do
    rm -f "plan1-$s.json" "run1-$s.json"
    soft_step "$s: plan for 1 GPU" "plan1-$s.log" to_file "plan1-$s.json" \
      "$planner" recommend "${common[@]}" --gpus 1 --gpus-per-node 1 --strategy "$s" --emit plan || continue
    soft_step "$s: executor on 1 GPU (NCCL)" "run1-$s.log" limited 240 \
      env CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 \
      MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 "$executor" --backend cuda --plan "plan1-$s.json" \
      --steps 3 --out "run1-$s.json" || continue
  done
  for s in "${STRATEGIES[@]}"; do
    rm -f "plan-$s.json" "run-$s.json" "validate-$s.json"
    soft_step "$s: plan" "plan-$s.log" to_file "plan-$s.json" \
      "$planner" recommend "${job[@]}" --strategy "$s" --emit plan || continue
    soft_step "$s: executor (rank 0 of $PLAN_GPUS rehearsed)" "run-$s.log" limited 240 \
      env CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" "$executor" --backend cuda \
      --plan "plan-$s.json" --rehearse-rank 0 --world $PLAN_GPUS --steps "$STEPS" \
      --out "run-$s.json" || continue
    soft_step "$s: validate" "validate-$s.log" "$planner" validate --plan "plan-$s.json" \
      --run "run-$s.json" || continue
    soft_step "$s: validate (json)" "validate-$s.json.log" to_file "validate-$s.json" \
      "$planner" validate --plan "plan-$s.json" --run "run-$s.json" --format json || rm -f "validate-$s.json"
  done

  echo
  print_table | tee table.txt
  echo "(table: $LOG/table.txt; $SECONDS s in all)" | tee -a gpu_check.log
  cat table.txt >> gpu_check.log
  if ((${#FAILED[@]} > 0)); then
    die "FAILED: $(printf '%s; ' "${FAILED[@]}" | sed 's/; $//') [logs: $LOG]"
  fi
}

main() {
  local deps=$DEFAULT_DEPS
  case ${1:-} in
    --prepare)
      (($# <= 2)) || { usage >&2; exit 2; }
      prepare "${2:-$DEFAULT_DEPS}"
      return
      ;;
    -h | --help)
      usage
      return
      ;;
    --deps)
      (($# >= 2)) || { usage >&2; exit 2; }
      deps=$2
      shift 2
      ;;
  esac
  (($# == 1)) || { usage >&2; exit 2; }
  mkdir -p "$1"
  LOG=$(cd "$1" && pwd)
  check "$deps"
}

main "$@"
