#!/usr/bin/env bash
# The whole loop on one CPU machine, with MPI ranks standing in for GPUs:
#
#   calibrate (MPI, 2 ranks, a small capacity)  ->  planner recommend (that profile)
#     ->  executor (2 ranks, the recommended plan, under that capacity)  ->  planner validate
#
# and one last line: "peak memory error X%, step time error Y%" (the prediction's error relative
# to the measurement). A few minutes on a 2-core machine; most of it is calibrate.
#
# Environment: BUILD_DIR (default build/release), WORK_DIR (default a new temporary folder),
# CAPACITY_GIB (the device size the plan must fit, default 0.06), STEPS (default 6).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(cd "${BUILD_DIR:-$ROOT/build/release}" && pwd)
WORK=${WORK_DIR:-$(mktemp -d)}
CAPACITY_GIB=${CAPACITY_GIB:-0.06}
STEPS=${STEPS:-6}
RANKS=2
SEQ=128
GLOBAL_BATCH=8
export SHARDPLAN_DATA_DIR=$ROOT

PLANNER=$BUILD/planner/planner
CALIBRATE=$BUILD/calibrate/calibrate
EXECUTOR=$BUILD/executor/executor
for program in "$PLANNER" "$CALIBRATE" "$EXECUTOR"; do
  [[ -x $program ]] || { echo "missing $program: build first (cmake --preset release && cmake --build --preset release)" >&2; exit 1; }
done
MPIRUN=(mpirun --oversubscribe --mca btl_vader_single_copy_mechanism none)
[[ $(id -u) == 0 ]] && MPIRUN+=(--allow-run-as-root)
mkdir -p "$WORK"
cd "$WORK"
echo "working in $WORK"

# 1. The model: Llama-3-8B's architecture (GQA, SwiGLU, RMSNorm, rotary, untied head) scaled down
#    to what a laptop core trains in a fraction of a second per step; the planner plans exactly it.
"$EXECUTOR" scale-config --model llama-3-8b --layers 4 --hidden 128 --heads 4 --kv-heads 2 \
  --intermediate 384 --vocab 8192 --out model.json

# 2. Calibrate the ranks: MPI collectives, the model's GEMMs and its attention core (eager and
#    flash) at the tokens of a micro-batch of one sequence, memory bandwidth. The profile is the
#    device the plan is for: a CPU rank (gpu.kind cpu: collectives block compute; no CUDA context,
#    no fragmentation reserve: the executor's tracked allocator has none) with a small memory
#    (--gpu-memory-GiB), so the planner has to choose. Ranks that share a few cores time their
#    collectives unevenly: --accept-poor-fit writes fits that miss their error goal (the planner
#    then says how poor they are) where calibrate would otherwise refuse them.
"${MPIRUN[@]}" -np $RANKS "$CALIBRATE" --backend mpi --gemm-model model.json --gemm-tokens $SEQ \
  --attention-seq $SEQ --max-bytes 16M --gpu-memory-GiB "$CAPACITY_GIB" --out device.json \
  --accept-poor-fit \
  > calibrate.log
tail -n 4 calibrate.log

# 3. Recommend. fp32 (the CPU executor also runs bf16-mixed and fp16-mixed, in 16-bit storage with
#    fp32 arithmetic: a CPU has no 16-bit GEMM rate to calibrate); attention, checkpointing and
#    offload as the planner chooses: the CPU executor runs flash attention (tiled, on the host)
#    and optimizer or parameter offload (to a host pool the device's memory does not count).
JOB=(--model model.json --hardware device.json --gpus $RANKS --seq-len $SEQ --global-batch $GLOBAL_BATCH
     --precision fp32 --recipe executor)
"$PLANNER" recommend "${JOB[@]}" --top 3 | sed -n '1,20p'
"$PLANNER" recommend "${JOB[@]}" --emit plan > plan.json

# 4. Run the plan on 2 ranks under the same capacity.
"${MPIRUN[@]}" -np $RANKS "$EXECUTOR" --plan plan.json --steps "$STEPS" --out run.json \
  --gpu-memory-GiB "$CAPACITY_GIB"

# 5. Predicted against measured; the last line is "peak memory error X%, step time error Y%".
"$PLANNER" validate --plan plan.json --run run.json
