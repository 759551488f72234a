#!/usr/bin/env bash
# Regenerates the memory corpora the cost model is tested against, with the frameworks' own code:
#   tests/costmodel/data/oracle_units.json  bytes autograd keeps per unit (validation/measure_units.py)
#   tests/costmodel/data/oracle_steps.json  whole-step peaks, PyTorch's MemTracker (validation/measure_steps.py)
#   tests/costmodel/data/oracle_steps_stress.json  whole steps of sequence 1024 under bf16 autocast: MQA, exact GELU,
#                                               a sliding window (validation/measure_steps.py --grid stress)
#   tests/costmodel/data/oracle_fsdp1_steps.json  FSDP1's whole steps in fp32 and under Composer's mixed precision
#                                               modes DEFAULT, PURE, FULL (validation/measure_fsdp1_steps.py)
#   tests/costmodel/data/oracle_deepspeed.json  DeepSpeed's ZeRO-0/1/2/3 steps; ZeRO-0 also with the config's own
#                                               optimizer (DeepSpeed's FusedAdam); ZeRO-1 bf16 also with fp32 gradient
#                                               accumulation (BF16_Optimizer) (validation/measure_deepspeed.py)
#   tests/costmodel/data/oracle_deepspeed_hf_auto.json  ZeRO-1/2/3 with transformers' "auto" bucket sizes
#                                               (validation/measure_deepspeed.py --buckets hf-auto)
#   tests/costmodel/data/oracle_deepspeed_executor.json  the executor's tiny GPT-2 with its planned bucket
#                                               (validation/measure_deepspeed.py --buckets executor)
#   tests/costmodel/data/oracle_traffic.json    bytes the memory-bound ATen ops move per unit (validation/measure_traffic.py)
#   tests/costmodel/data/oracle_tensor_parallel.json  PyTorch's own tensor parallelism (DTensor styles, t = 2) on
#                                               HF Llama: transformers' plan and torchtitan's SP layout (validation/measure_tensor_parallel.py)
#   tests/costmodel/data/oracle_pipeline.json   PyTorch's own pipelining (PipelineStage, GPipe and 1F1B, p = 2) on
#                                               HF Llama split as torchtitan splits it, per stage (validation/measure_pipeline.py)
#   tests/costmodel/data/oracle_deepspeed_pipeline.json  DeepSpeed's own PipelineEngine (PipelineModule of HF Llama's
#                                               layers, p = 2, ZeRO 0/1, fp32 and bf16), per stage, with its schedule's
#                                               instructions (validation/measure_deepspeed_pipeline.py)
#   tests/costmodel/data/oracle_fsdp_tp.json    FSDP2 over PyTorch's TP (torchtitan's 2-D layout, dp_shard 2 x tp 2) on
#                                               HF Llama (validation/measure_fsdp_tp.py)
#   tests/costmodel/data/oracle_tp_units.json   bytes torchtitan's own Llama keeps per unit under its own tensor
#                                               parallelism (t = 2, sequence parallel; none, selective-op, full),
#                                               eager and torch.compile'd (apply_compile; "compile": true, block 0's
#                                               saved tensors with their graph nodes) (validation/measure_tp_units.py)
#   tests/costmodel/data/oracle_compile_units.json  what torchtitan's compiled block keeps and its kernels move
#                                               (validation/measure_compile_units.py)
#   tests/costmodel/data/oracle_accelerate_steps.json  whole steps under accelerate's own FSDP1/FSDP2 preparation
#                                               (validation/measure_accelerate_steps.py, in validation/.venv-accelerate:
#                                               validation/requirements-accelerate.txt)
#   tests/costmodel/data/oracle_overheads.json  host-side step overheads: op dispatch, DDP/FSDP1/FSDP2/ZeRO-3
#                                               hooks per unit and tensor, CPU optimizers (validation/measure_overheads.py)
#   tests/costmodel/data/oracle_float8_units.json  what torchtitan's block keeps under torchao's Float8 training
#                                               (tensorwise, rowwise; eager and compiled) and what FSDP2 all-gathers
#                                               for it (validation/measure_float8_units.py, in validation/.venv-float8:
#                                               validation/requirements-float8.txt)
#   tests/documents/data/mpt_params.json        llm-foundry's own MPT's parameters per unit (validation/measure_mpt_params.py)
#   tests/costmodel/data/oracle_mpt_units.json  bytes llm-foundry's own MPT block keeps per unit
#                                               (validation/measure_mpt_units.py); both in a second venv,
#                                               validation/.venv-llm-foundry (validation/requirements-llm-foundry.txt)
# Usage: validation/regenerate.sh [VENV_DIR]   (default validation/.venv; made on first use from
# validation/requirements.txt, PyPI's torch, transformers, torchtitan and deepspeed). CPU only, about 30 minutes
# on two cores. Not part of the test command: the corpora are checked in.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-validation/.venv}
if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet -r validation/requirements.txt
fi
py=$venv/bin/python
"$py" validation/measure_units.py --out tests/costmodel/data/oracle_units.json
planner=build/release/planner/planner
extra=()
[[ -x $planner ]] && extra=(--planner "$planner")
"$py" validation/measure_steps.py --out tests/costmodel/data/oracle_steps.json "${extra[@]}"
"$py" validation/measure_steps.py --grid stress --out tests/costmodel/data/oracle_steps_stress.json "${extra[@]}"
"$py" validation/measure_fsdp1_steps.py --out tests/costmodel/data/oracle_fsdp1_steps.json
"$py" validation/measure_deepspeed.py --out tests/costmodel/data/oracle_deepspeed.json
"$py" validation/measure_deepspeed.py --buckets hf-auto --out tests/costmodel/data/oracle_deepspeed_hf_auto.json
"$py" validation/measure_deepspeed.py --buckets executor --out tests/costmodel/data/oracle_deepspeed_executor.json
"$py" validation/measure_traffic.py --out tests/costmodel/data/oracle_traffic.json
"$py" validation/measure_tensor_parallel.py --out tests/costmodel/data/oracle_tensor_parallel.json
"$py" validation/measure_pipeline.py --out tests/costmodel/data/oracle_pipeline.json
"$py" validation/measure_deepspeed_pipeline.py --out tests/costmodel/data/oracle_deepspeed_pipeline.json
"$py" validation/measure_fsdp_tp.py --out tests/costmodel/data/oracle_fsdp_tp.json
"$py" validation/measure_tp_units.py --out tests/costmodel/data/oracle_tp_units.json
"$py" validation/measure_compile_units.py --out tests/costmodel/data/oracle_compile_units.json
"$py" validation/measure_overheads.py --out tests/costmodel/data/oracle_overheads.json
accelerate=validation/.venv-accelerate
if [[ ! -x "$accelerate/bin/python" ]]; then
  python3 -m venv "$accelerate"
  "$accelerate/bin/pip" install --quiet -r validation/requirements-accelerate.txt
fi
"$accelerate/bin/python" validation/measure_accelerate_steps.py --out tests/costmodel/data/oracle_accelerate_steps.json
float8=validation/.venv-float8
if [[ ! -x "$float8/bin/python" ]]; then
  python3 -m venv "$float8"
  "$float8/bin/pip" install --quiet -r validation/requirements-float8.txt
fi
"$float8/bin/python" validation/measure_float8_units.py --out tests/costmodel/data/oracle_float8_units.json
foundry=validation/.venv-llm-foundry
if [[ ! -x "$foundry/bin/python" ]]; then
  python3 -m venv "$foundry"
  "$foundry/bin/pip" install --quiet -r validation/requirements-llm-foundry.txt
fi
"$foundry/bin/python" validation/measure_mpt_params.py --out tests/documents/data/mpt_params.json
"$foundry/bin/python" validation/measure_mpt_units.py --out tests/costmodel/data/oracle_mpt_units.json
echo "corpora written; compare with: build/release/bench/memory_corpus --summary"
