#!/usr/bin/env python3
# Over 800 lines: one corpus, one command: the models, the hooks that measure and the writer stay
# in the one script that regenerates the corpus.
"""Measure the memory of whole training steps of DeepSpeed's ZeRO-0/1/2/3 engines with PyTorch's MemTracker.

What it measures
    The step of validation/measure_steps.py (``transformers.LlamaForCausalLM``, the "llama-h256"
    config, float32 initialisation, sdpa attention, the model's own loss with labels = input ids,
    ``torch.optim.AdamW(lr=1e-3, foreach=True)``; two steps, the second measured), run through
    DeepSpeed's own engine: ``deepspeed.initialize(model=model, optimizer=<that AdamW>,
    config=...)`` on gloo with world size 2 (CPU, ``DS_ACCELERATOR=cpu``), then
    ``loss = engine(...).loss; engine.backward(loss); engine.step()``. The grid is: ZeRO stage
    0/1/2/3 x precision ("fp32", "bf16-mixed") x sequence length 128/256 x micro-batch 1/2, without
    activation checkpointing, at stage 0 both optimizer sources (below), and at stage 1 under
    bf16-mixed also a float32 gradient accumulation dtype (BF16_Optimizer, below: 4 more cases).

    The DeepSpeed config is ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps: 1``,
    ``zero_optimization: {"stage": N}`` with DeepSpeed's defaults otherwise (contiguous_gradients,
    reduce_scatter, reduce_bucket_size 5e8 elements, allgather_bucket_size 5e8, overlap_comm off
    for stages 1/2 and on for stage 3, stage3_prefetch_bucket_size 5e7,
    stage3_param_persistence_threshold 1e5, memory_efficient_linear, gradient_clipping 1.0), and
    ``zero_allow_untested_optimizer: true`` (DeepSpeed refuses a client torch AdamW under ZeRO
    without it; stage 0 does not read it). "bf16-mixed" adds ``"bf16": {"enabled": true}``:
    DeepSpeed casts the module to bfloat16 (no autocast) and keeps a float32 master copy (stages
    1/2/3: partitioned); "fp32" has no bf16 section. Each case records the exact config it used
    (deepspeed_config).

    The stage-1 bf16-mixed cases are measured twice: with DeepSpeed's default gradient accumulation
    dtype (no data_types section: the model's bf16; grad_accum_dtype null) and with ``"data_types":
    {"grad_accum_dtype": "fp32"}`` (id suffix "/accum-fp32", grad_accum_dtype "fp32"), as configs
    written for Megatron-DeepSpeed set it with bf16 at ZeRO stage 1. With bf16 parameters, float32
    accumulation, stage 1 and no CPU offload, ``_do_optimizer_sanity_check`` returns BFLOAT16 and
    ``_configure_bf16_optimizer`` wraps the client AdamW in ``BF16_Optimizer``
    (runtime/bf16_optimizer.py) instead of ZeRO's ``DeepSpeedZeroOptimizer``:
    ``_setup_for_real_optimizer`` flattens the parameters into one bf16 buffer
    (``bf16_groups_flat``, aligned to 2 x the data-parallel size; the parameters become views of
    it), clones this rank's share of it (1 / the data-parallel size: half here) into a float32
    master partition (``fp32_groups_flat_partition``, the one tensor the AdamW steps) and allocates
    a whole flat gradient-accumulation buffer in the accumulation dtype
    (``fp32_groups_gradients_flat``, every parameter's gradient, with per-parameter views).
    ``immediate_grad_update`` (the bf16 section's, default false in 0.19.8, recorded per case) is
    off: autograd's bf16 .grad stays, and ``backward_epilogue`` -> ``update_hp_grads`` adds each
    one, cast to float32, into its view at the end of ``engine.backward``; then
    ``allreduce_gradients`` -> ``buffered_allreduce_fallback`` all-reduces that buffer
    (``get_grads_for_reduction``). ``allreduce_bucket`` flattens the one buffer to a view, casts it
    to the communication dtype (bf16: ``communication_data_type`` defaults to the model's under
    bf16), all-reduces the bf16 copy and copies it back. The step (``BF16_Optimizer.step``) takes
    the norm of every parameter's view of the buffer, scales them in place where it exceeds
    gradient_clipping (1.0), sets the master's .grad to this rank's partition of the buffer (a view
    when it is float32), runs the AdamW, copies the master into this rank's bf16 partition,
    all-gathers the partitions into ``bf16_groups_flat`` (``update_lp_params`` ->
    ``all_gather_dp_groups``) and zeroes the buffer (``clear_hp_grads``); the engine's
    ``_take_model_step`` then calls its ``zero_grad``, which sets the bf16 .grad to None
    (``clear_lp_grads(set_to_none=True)``).

    The optimizer comes from one of two places (optimizer_source):

    - "client", every stage: the AdamW above, passed to ``deepspeed.initialize``;
    - "deepspeed-config", stage 0 only (id suffix "/ds-adamw"): no client optimizer; the config
      has ``"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}`` and DeepSpeed builds its own
      ``FusedAdam`` (``_configure_basic_optimizer``, ``get_optimizer_configuration``: adam_w_mode,
      its defaults otherwise, weight_decay 0 where torch's AdamW has 0.01). On the CPU
      accelerator its op is a C++ extension JIT-built at the first use (op_builder/cpu/
      fused_adam.py: ``multi_tensor_adam`` runs DeepSpeed's CPU Adam on each tensor in place, no
      temporaries); its states are exp_avg and exp_avg_sq (the step is a Python int).

    The source decides stage 0's bf16 wrapper. Without ZeRO, with bf16 parameters and gradients
    and no pipeline, ``_do_optimizer_sanity_check`` picks DDP_BFLOAT16, and
    ``_configure_fp16_optimizer`` wraps a FusedAdam in ``FP16_Optimizer`` (fused_optimizer.py:
    flat buffers) and any other optimizer, the client's torch AdamW included, in
    ``FP16_UnfusedOptimizer`` (unfused_optimizer.py: a float32 master per parameter): a config
    with an optimizer section gets the first, a client torch optimizer the second. Under fp32,
    stage 0 has no wrapper: ``engine.optimizer`` is the basic optimizer (AdamW or FusedAdam)
    stepping the module's own parameters, and the engine clips their gradients first
    (``clip_fp32_gradients``). Stages 1/2/3 wrap either source in their ZeRO optimizer alike, so
    the config's optimizer is measured at stage 0 only. At stage 0 the gradients are all-reduced
    at the end of ``engine.backward`` (``allreduce_gradients``; the data-parallel replicas keep
    whole copies of everything else).

How it measures
    ``torch.distributed._tools.mem_tracker.MemTracker`` with the ``_PeakProbe`` of
    measure_steps.py (each category's own peak; module and phase at the peak). The engine's
    module, the basic optimizer that DeepSpeed drives (``engine.basic_optimizer``: the client
    AdamW or DeepSpeed's FusedAdam; its states sit on DeepSpeed's float32 master copy, or at fp32
    stage 0 on the module's parameters) and the batch are registered with ``track_external``
    before the measured step.

    The tracker only knows the model's parameters, buffers and gradients, activations, temps and
    the optimizer's states; it sees other storages from the first op that returns them and files
    them by phase. DeepSpeed keeps its own flat buffers, so this harness also registers those it
    holds before the step, and names the ones it allocates inside the step, in these categories
    (the names of measure_steps.py where they mean the same):

    - parameters: the module's parameters (stage 0: the module's own under fp32 and
      FP16_UnfusedOptimizer, views into FP16_Optimizer's flat copy fp16_groups_flat; stages 1/2:
      views into DeepSpeed's flat weight buffer, bit16_groups_flat, or under BF16_Optimizer
      bf16_groups_flat; stage 3: the persistent, never-partitioned ones below
      stage3_param_persistence_threshold);
    - sharded_parameters: stage 3's low-precision partition of the parameters (lp_param_buffer);
    - unsharded_parameters: stage 3's gathered parameters, forward and backward: the tensors the
      gather handles' ``wait()`` gives each parameter (copies out of a coalesced gather, or a
      single parameter's gathered buffer);
    - master_parameters: the float32 master copy the basic optimizer steps (stage 0, bf16:
      FP16_Optimizer's flat fp32_groups_flat, FP16_UnfusedOptimizer's fp32_groups, a clone per
      parameter; none under fp32; stages 1/2: the partition single_partition_of_fp32_groups;
      BF16_Optimizer's partition fp32_groups_flat_partition; stage 3's
      fp32_partitioned_groups_flat);
    - gradients: the parameters' .grad as autograd makes them (the tracker's own);
    - accumulated_gradients: BF16_Optimizer's fp32_groups_gradients_flat, the whole model's flat
      gradient-accumulation buffer in the grad_accum dtype, kept from initialize (as
      validation/measure_deepspeed_pipeline.py names it);
    - sharded_gradients: DeepSpeed's gradient partition (stages 1/2: grads_in_partition, made in
      ``copy_grads_in_partition``; stage 3: grad_partitions_flat_buffer);
    - master_gradients: the float32 gradient of the master copy. At stages 1/2/3 DeepSpeed makes
      it inline (``flat.to(float32)``), so it is filed here from the DeepSpeed call just after that
      op (stages 1/2: ``unscale_and_clip_grads``; stage 3: the end of
      ``_prepare_fp32_grad_for_sub_group``); at the op itself it counts as step_temp. Stage 0:
      ``FP16_UnfusedOptimizer.step`` sets each master's .grad to ``grad.to(float32)`` of its
      parameter, inline, between the group's ``get_weight_norm`` and ``get_global_norm``: the
      storages first seen in that span; ``FP16_Optimizer.step`` flattens per-parameter float32
      casts of the gradients (step_temp, freed once flattened) into one flat gradient, set as
      fp32_groups_flat's .grad: the storage first seen in its ``_flatten_dense_tensors``.
      BF16_Optimizer.step sets it to ``grad_partition.to(float32)`` only when the accumulation
      dtype is not float32 (filed when the basic optimizer's step starts); with the float32
      buffer it is a view of accumulated_gradients, so nothing here;
    - gradient_buckets: the ipg bucket buffers (reduce_bucket_size elements each; stages 1/2
      allocate them in ``setup_buckets`` at each backward and free them at its end, stage 3 keeps
      them from initialize);
    - gradient_allreduce: stage 0's and BF16_Optimizer's storages first seen in
      ``engine.allreduce_gradients`` (at the end of ``engine.backward``):
      ``buffered_allreduce_fallback`` -> ``allreduce_no_retain`` -> ``allreduce_and_copy`` ->
      ``allreduce_bucket`` flattens the gradients of each bucket (up to 5e8 elements: one here)
      into a new tensor (``self.flatten``) in their dtype (the communication dtype defaults to it,
      no cast), all-reduces it and copies it back into the gradients; it is freed when
      ``allreduce_and_copy`` returns. BF16_Optimizer's bucket is its one float32 accumulation
      buffer, which flattens to a view: the storage here is its cast to the bf16 communication
      dtype;
    - reduce_scatter: storages first seen in the gradient reduction (stages 1/2
      ``reduce_ipg_grads``, stage 3 ``__reduce_and_partition_ipg_grads``);
    - all_gather: storages first seen in stages 1/2's all-gather of the updated weights
      (``all_gather_dp_groups``: ZeRO's step, BF16_Optimizer's ``update_lp_params``; the partitions
      are gathered in place into the flat buffer), and stage 3's flat all-gather outputs (first
      seen in ``PartitionedParameterCoordinator.fetch_sub_module`` outside the handles'
      ``wait()``);
    - step_temp: anything else first seen in ``engine.step()`` outside the basic optimizer's own
      step (the flattened gradient partition, the gradient norm's temporaries; at stage 0 the
      overflow check's and the clipping norm's temporaries, and FP16_Optimizer's per-parameter
      float32 casts; BF16_Optimizer: the 0-d norms of ``get_global_norm_of_tensors``);
    - temp: anything else first seen in ``engine.backward()`` (the tracker's backward temps, and
      DeepSpeed's work after autograd: BF16_Optimizer's ``update_hp_grads`` casts each bf16
      .grad to float32, one parameter at a time, before adding it into its view);
    - optimizer_states / optimizer_temp: the basic optimizer's states and its step's
      intermediates (AdamW's foreach ones; FusedAdam has none), split as in measure_steps.py.
    The DeepSpeed categories are sticky: the tracker's gradient and parameter hooks do not refile a
    storage that DeepSpeed owns (e.g. stage 2/3's .grad views into the ipg bucket stay
    gradient_buckets). Registering DeepSpeed's buffers makes totals include them from the start of
    the step rather than from their first use; otherwise no refinement changes a total.

    Stage 3 replaces ``torch.nn.functional.linear`` for the whole process
    (memory_efficient_linear, "persists unless manually reset"); the harness restores it after each
    case, so every case runs with the functions its own stage installs.

    deepspeed_buffers records, per case, the bytes (distinct storages) of DeepSpeed's buffers and
    of the basic optimizer's states ("client_optimizer_states", or "basic_optimizer_states" for
    the config's FusedAdam) right after ``deepspeed.initialize``; deepspeed_buffers_in_step the
    largest size of each over the measured step, with those made lazily (stages 1/2's ipg buckets
    and grads_in_partition, the master gradient, stage 3's persistent parameters, listed at the
    first forward, stage 0's all-reduce bucket (allreduce_bucket), and the optimizer's states,
    made at the first step; the FP16 wrappers make them in initialize with a step on zero
    gradients, ``initialize_optimizer_states``). BF16_Optimizer's are bf16_groups_flat,
    fp32_groups_flat_partition and fp32_groups_gradients_flat, all made in initialize (and
    master_gradient where the accumulation dtype is not float32). deepspeed_buffer_aliases lists
    buffers that share a storage. All of it runs on CPU tensors: byte counts are
    ``numel * element_size`` (torch.empty of a bucket counts in full, as it would on an
    accelerator), no allocator rounding.

    Both ranks run every case in one torchrun launch (gloo, one intra-op thread per rank), each
    case REPEATS times per rank (a fresh engine each time): where a peak falls at the end of the
    backward, gloo's threads release the reduction's buffers at times that vary from run to run,
    and so may that peak. The corpus keeps rank 0's first record, with every rank's first peak
    (rank_peak_bytes) and [min, max] over ranks and repeats (peak_bytes_range). DeepSpeed's CPU
    accelerator JIT-builds its shared-memory comm op (used only for inference all-reduce) at the
    first init, and the FusedAdam op at the first config-built optimizer, with the system C++
    compiler (torch's extension cache keeps them); the training collectives go through gloo.

Output
    A JSON corpus (``--out``) in the format of oracle_steps.json: versions, the model config, and
    one record per case with wrapper "deepspeed-zero0/1/2/3", world_size 2, optimizer_source
    ("client" or "deepspeed-config"), grad_accum_dtype (the config's data_types.grad_accum_dtype:
    "fp32", or null where the config has none and DeepSpeed accumulates in the model dtype),
    peak_bytes, at_peak, category_peaks, peak_module, peak_phase, plus deepspeed_config,
    deepspeed_optimizer (the class of ``engine.optimizer``: the wrapper DeepSpeed put around the
    basic optimizer, or at fp32 stage 0 the basic optimizer's own class, AdamW or FusedAdam),
    immediate_grad_update (BF16_Optimizer's, read from the optimizer; null for the other
    wrappers), deepspeed_buffers, deepspeed_buffers_in_step, deepspeed_buffer_aliases,
    optimizer_states_on_master (whether every tensor the basic optimizer keeps state for is one of
    the float32 tensors DeepSpeed has it step: ZeRO's and BF16_Optimizer's master partitions,
    stage 0's FP16 wrappers' master copy, or, with no wrapper at fp32 stage 0, the module's own
    parameters, which are then the master copy), and collectives: per collective,
    the calls, nccl-tests size (bytes) and bytes one rank sends (size x the ring's bus factor, 2
    ranks) of what the measured step asked deepspeed.comm for (CollectiveCounter: the request,
    whichever way gloo carries it out).

Usage
    python validation/measure_deepspeed.py --out tests/costmodel/data/oracle_deepspeed.json
    python validation/measure_deepspeed.py --buckets hf-auto \\
        --out tests/costmodel/data/oracle_deepspeed_hf_auto.json
    python validation/measure_deepspeed.py --buckets executor \\
        --out tests/costmodel/data/oracle_deepspeed_executor.json
"""

import argparse
import functools
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

# The harness of bare/DDP/FSDP2 steps; this script's directory is on sys.path when it runs.
from measure_steps import (CATEGORY_NAMES, CONFIGS as STEP_CONFIGS, MICRO_BATCHES,
                           SCHEMA_VERSION, SEQ_LENS, WARMUP_STEPS, _PeakProbe, build_model,
                           command_line, in_category_order, make_batch, make_optimizer, merge_ranks,
                           optimizer_state_bytes, parameter_count, report, split_optimizer,
                           versions as steps_versions, write_corpus)

GENERATED_BY = "validation/measure_deepspeed.py"
CONFIG = "llama-h256"
# The executor's case (--buckets executor): GPT-2 scaled to 64 wide, 3 blocks, 4 heads, a 257-token
# vocabulary (`executor scale-config --model gpt2 --layers 3 --hidden 64 --heads 4 --vocab 257`),
# fp32, sequence 32, micro-batch 2, with the bucket `planner recommend --recipe executor` plans
# for it on the CPU test profile (reduce_bucket_bytes 2e8 = 5e7 fp32 elements). Every tensor is
# below stage3_param_persistence_threshold, so stage 3 keeps all of them whole.
EXECUTOR_CONFIG = "gpt2-e64-l3-v257"
STEP_CONFIGS[EXECUTOR_CONFIG] = dict(
    STEP_CONFIGS["gpt2-h256"], n_embd=64, n_layer=3, n_head=4, n_inner=256, vocab_size=257)
EXECUTOR_REDUCE_BUCKET = 50_000_000  # elements
CONFIGS = {CONFIG: STEP_CONFIGS[CONFIG]}
STAGES = (0, 1, 2, 3)
# Where the optimizer comes from: "client", the AdamW of measure_steps.py passed to
# deepspeed.initialize; "deepspeed-config", the config's own optimizer section, which DeepSpeed
# builds itself (its FusedAdam). The second at stage 0 only, where it changes the bf16 wrapper.
OPTIMIZER_SOURCES = ("client", "deepspeed-config")
CONFIG_OPTIMIZER = {"type": "AdamW", "params": {"lr": 1e-3}}
PRECISIONS = ("fp32", "bf16-mixed")
# The config's data_types.grad_accum_dtype: None (no data_types section: DeepSpeed accumulates in
# the model dtype) everywhere, and "fp32" (id suffix "/accum-fp32") at stage 1 under bf16-mixed,
# where it makes the engine wrap the optimizer in BF16_Optimizer instead of ZeRO's.
GRAD_ACCUM_FP32 = "fp32"
WORLD_SIZE = 2
# Measurements per case and rank. Where a peak falls at the end of the backward, gloo's threads
# release the reduction's buffers when they get to it, so that peak can differ from run to run (by
# the gradient partition, ~0.5% here): the corpus records the range, as measure_steps.py's FSDP2.
REPEATS = 3

# DeepSpeed's categories: the tracker's reference type value -> the corpus name.
DS_CATEGORIES = {
    "Master Param": "master_parameters",
    "Sharded Param": "sharded_parameters",
    "Unsharded Param": "unsharded_parameters",
    "Sharded Grad": "sharded_gradients",
    "Master Grad": "master_gradients",
    "Gradient Buckets": "gradient_buckets",
    "Reduce Scatter": "reduce_scatter",
    "All Gather": "all_gather",
    "Gradient Allreduce": "gradient_allreduce",
    "Step Temp": "step_temp",
    "Accumulated Grad": "accumulated_gradients",
}
NAMES = {**CATEGORY_NAMES, **DS_CATEGORIES}
ORDER = ("parameters", "sharded_parameters", "unsharded_parameters", "master_parameters", "buffers",
         "gradients", "accumulated_gradients", "sharded_gradients", "master_gradients",
         "gradient_buckets", "activations", "temp", "gradient_allreduce", "reduce_scatter",
         "all_gather", "step_temp", "optimizer_states", "optimizer_temp", "other")


# ----------------------------------------------------------------------------------------------
# The grid


# The ZeRO bucket sizes (--buckets): "default", DeepSpeed's own (reduce_bucket_size 5e8 elements,
# which dominates these small models' peaks); "hf-auto", the values transformers' Trainer writes
# over a config's "auto" (transformers/integrations/deepspeed.py, HfTrainerDeepSpeedConfig
# trainer_config_finalize: reduce_bucket_size h*h, and at stage 3 stage3_prefetch_bucket_size
# 0.9*h*h and stage3_param_persistence_threshold 10*h), as users of small models run them.
BUCKETS = ("default", "hf-auto", "executor")


def bucket_keys(buckets, config_name, stage):
    """The zero_optimization keys a bucket choice sets (none for DeepSpeed's defaults); the
    stage-3 keys at stage 3 only, as transformers fills them."""
    if buckets == "default":
        return {}
    if buckets == "executor":
        return {"reduce_bucket_size": EXECUTOR_REDUCE_BUCKET}
    h = CONFIGS[config_name]["hidden_size"]
    keys = {"reduce_bucket_size": h * h}
    if stage == 3:
        keys.update(stage3_prefetch_bucket_size=int(0.9 * h * h),
                    stage3_param_persistence_threshold=10 * h)
    return keys


def optimizer_sources(stage, buckets):
    """The optimizer sources measured: both at stage 0 with DeepSpeed's own buckets, else the
    client's. Stage 0 has no ZeRO bucket, so the hf-auto and executor grids leave it out."""
    if stage == 0:
        return OPTIMIZER_SOURCES if buckets == "default" else ()
    return OPTIMIZER_SOURCES[:1]


def grad_accum_dtypes(stage, buckets):
    """The grad_accum_dtype variants measured: DeepSpeed's default (None) everywhere, and "fp32"
    (bf16-mixed only, BF16_Optimizer) at stage 1 with DeepSpeed's own buckets."""
    return (None, GRAD_ACCUM_FP32) if stage == 1 and buckets == "default" else (None,)


def case_grid(only=None, buckets="default"):
    """Every (stage, optimizer source, grad_accum_dtype, precision, seq_len, micro_batch), in
    corpus order (stages in `only` if given)."""
    for stage in STAGES:
        if only and wrapper_name(stage) not in only:
            continue
        for source in optimizer_sources(stage, buckets):
            if buckets == "executor":
                yield {"stage": stage, "config": EXECUTOR_CONFIG, "seq_len": 32, "micro_batch": 2,
                       "precision": "fp32", "checkpointing": "none", "buckets": buckets,
                       "optimizer_source": source, "grad_accum_dtype": None}
                continue
            for accum in grad_accum_dtypes(stage, buckets):
                for precision in PRECISIONS if accum is None else ("bf16-mixed",):
                    for seq_len in SEQ_LENS:
                        for micro_batch in MICRO_BATCHES:
                            yield {"stage": stage, "config": CONFIG, "seq_len": seq_len,
                                   "micro_batch": micro_batch, "precision": precision,
                                   "checkpointing": "none", "buckets": buckets,
                                   "optimizer_source": source, "grad_accum_dtype": accum}


def wrapper_name(stage):
    return f"deepspeed-zero{stage}"


def case_id(case):
    suffix = "" if case["buckets"] == "default" else "/" + case["buckets"]
    if case["optimizer_source"] == "deepspeed-config":
        suffix += "/ds-adamw"
    if case.get("grad_accum_dtype"):
        suffix += f"/accum-{case['grad_accum_dtype']}"
    return (f"{wrapper_name(case['stage'])}/{case['config']}/{case['precision']}/"
            f"{case['checkpointing']}/s{case['seq_len']}-b{case['micro_batch']}/w{WORLD_SIZE}"
            f"{suffix}")


def deepspeed_config(stage, precision, micro_batch, buckets="default", config_name=CONFIG,
                     optimizer_source="client", grad_accum_dtype=None):
    """The config passed to deepspeed.initialize: DeepSpeed's defaults but for these keys."""
    config = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage, **bucket_keys(buckets, config_name, stage)},
        # ZeRO accepts a client torch.optim.AdamW only with this (is_zero_supported_optimizer).
        "zero_allow_untested_optimizer": True,
    }
    if optimizer_source == "deepspeed-config":
        config["optimizer"] = json.loads(json.dumps(CONFIG_OPTIMIZER))
    if precision == "bf16-mixed":
        config["bf16"] = {"enabled": True}
    if grad_accum_dtype is not None:
        config["data_types"] = {"grad_accum_dtype": grad_accum_dtype}
    return config


# ----------------------------------------------------------------------------------------------
# DeepSpeed's buffers


def _storages(tensors):
    """{storage data pointer: (storage, bytes)} of the given tensors (None and empty skipped)."""
    from torch.distributed._tools.common_utils import get_untyped_storages

    out = {}
    for t in tensors:
        if t is None:
            continue
        for st in get_untyped_storages(t):
            if st.nbytes() > 0:
                out[st.data_ptr()] = (st, st.nbytes())
    return out


def _flat(obj):
    """Tensors in a tensor, list/tuple/dict of them (nested), or None."""
    import torch

    if obj is None:
        return []
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _flat(o)]
    return []


def buffer_groups(optimizer, stage):
    """[(name, category, [tensors])] of the buffers DeepSpeed's optimizer wrapper holds now (none
    for stage 0 without a wrapper).

    category is a DS_CATEGORIES key, or "Parameter" for storages the module's parameters view."""
    groups = []

    def add(name, category, obj):
        groups.append((name, category, _flat(obj)))

    if type(optimizer).__name__ == "BF16_Optimizer":
        # BF16_Optimizer._setup_for_real_optimizer: the flat bf16 copy the parameters view, the
        # rank's float32 master partition and the whole flat gradient-accumulation buffer (in the
        # grad_accum dtype). The master partition's .grad is a view of that buffer when it is
        # float32 (classify_bf16 notes a separate float32 copy as master_gradient).
        add("bf16_groups_flat", "Parameter", optimizer.bf16_groups_flat)
        add("fp32_groups_flat_partition", "Master Param", optimizer.fp32_groups_flat_partition)
        add("fp32_groups_gradients_flat", "Accumulated Grad", optimizer.fp32_groups_gradients_flat)
        return groups
    if stage == 0:
        # FP16_Optimizer.__init__: the flat low-precision copy the parameters view, and its flat
        # float32 master; FP16_UnfusedOptimizer.__init__: one float32 clone per parameter.
        if type(optimizer).__name__ == "FP16_Optimizer":
            add("fp16_groups_flat", "Parameter", optimizer.fp16_groups_flat)
            add("fp32_groups_flat", "Master Param", optimizer.fp32_groups_flat)
        elif type(optimizer).__name__ == "FP16_UnfusedOptimizer":
            add("fp32_groups", "Master Param", optimizer.fp32_groups)
        return groups
    if stage in (1, 2):
        add("bit16_groups_flat", "Parameter", getattr(optimizer, "bit16_groups_flat", None))
        add("single_partition_of_fp32_groups", "Master Param",
            getattr(optimizer, "single_partition_of_fp32_groups", None))
        add("grads_in_partition", "Sharded Grad", getattr(optimizer, "grads_in_partition", None))
        add("averaged_gradients", "Sharded Grad", getattr(optimizer, "averaged_gradients", None))
    else:
        add("lp_param_buffer (fp16_partitioned_groups_flat)", "Sharded Param",
            getattr(optimizer, "fp16_partitioned_groups_flat", None))
        add("fp32_partitioned_groups_flat", "Master Param",
            getattr(optimizer, "fp32_partitioned_groups_flat", None))
        add("grad_partitions_flat_buffer", "Sharded Grad",
            getattr(optimizer, "grad_partitions_flat_buffer", None))
        offload = getattr(optimizer, "parameter_offload", None)
        add("persistent_parameters", "Parameter",
            list(getattr(offload, "persistent_parameters", []) or []))
    for dtype, bucket in sorted(getattr(optimizer, "ipg_buckets", {}).items(), key=lambda kv: str(kv[0])):
        add(f"ipg_buckets[{str(dtype).replace('torch.', '')}].buffer", "Gradient Buckets",
            getattr(bucket, "buffer", None))
    return groups


def states_name(optimizer_source):
    """deepspeed_buffers' name for the basic optimizer's states: the client's, or the one DeepSpeed
    built from its config (DeepSpeedEngine.basic_optimizer)."""
    return "client_optimizer_states" if optimizer_source == "client" else "basic_optimizer_states"


def buffer_sizes(optimizer, stage, basic_optimizer, optimizer_source="client"):
    """({name: bytes}, [[name, name] sharing a storage]) of DeepSpeed's buffers and the basic
    optimizer's states."""
    sizes, owner, aliases = {}, {}, []
    groups = buffer_groups(optimizer, stage)
    states = [v for s in basic_optimizer.state.values() for v in s.values() if hasattr(v, "untyped_storage")]
    groups.append((states_name(optimizer_source), "Optstate", states))
    for name, _category, tensors in groups:
        stores = _storages(tensors)
        sizes[name] = sum(b for _st, b in stores.values())
        for ptr in stores:
            if ptr in owner and owner[ptr] != name and [owner[ptr], name] not in aliases:
                aliases.append([owner[ptr], name])
            owner.setdefault(ptr, name)
    return sizes, aliases


def master_tensors(optimizer, stage, module):
    """The float32 tensors the basic optimizer steps: ZeRO's master partitions, stage 0's wrapper's
    master copy, or without a wrapper (fp32 at stage 0) the module's own parameters."""
    if type(optimizer).__name__ == "BF16_Optimizer":
        return optimizer.fp32_groups_flat_partition
    if stage in (1, 2):
        return optimizer.single_partition_of_fp32_groups
    if stage == 3:
        return optimizer.fp32_partitioned_groups_flat
    if type(optimizer).__name__ == "FP16_Optimizer":
        return optimizer.fp32_groups_flat
    if type(optimizer).__name__ == "FP16_UnfusedOptimizer":
        return [t for group in optimizer.fp32_groups for t in group]
    return list(module.parameters())


def states_on_master(optimizer, stage, basic_optimizer, module):
    """Whether every key of the basic optimizer's state is one of master_tensors."""
    ids = {id(t) for t in master_tensors(optimizer, stage, module)}
    return bool(basic_optimizer.state) and all(id(p) in ids for p in basic_optimizer.state)


# ----------------------------------------------------------------------------------------------
# Tracker


def _ds_reftype():
    from torch.distributed._tools.mem_tracker import _RefType

    return _RefType("DeepSpeedRefType", [(k.upper().replace(" ", "_"), k) for k in DS_CATEGORIES])


def make_tracker(engine, basic_optimizer, ids):
    from torch.distributed._tools.common_utils import get_untyped_storages
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

    ds_ref = _ds_reftype()
    by_value = {m.value: m for m in ds_ref}
    by_value.update({"Parameter": _MemRefType.PARAM, "Optstate": _MemRefType.OPT})

    class DeepSpeedMemTracker(_PeakProbe, MemTracker):
        """MemTracker + _PeakProbe, with a stack of reference types for storages first seen in
        DeepSpeed's functions, a stack of phases, and sticky DeepSpeed categories."""

        def _ds_init(self):
            self.ds_override = []  # reference type for storages first seen, innermost last
            self.ds_phase = []  # "backward" in engine.backward, "step" in engine.step
            self.ds_lazy = {}  # buffer name -> largest bytes seen inside the step

        def reftype(self, value):
            return by_value[value]

        def _phase(self):
            if self._in_opt:
                return "optimizer"
            if self._mod_tracker.is_bw:
                return super()._phase()
            return self.ds_phase[-1] if self.ds_phase else super()._phase()

        def _track(self, reftype, t):
            if self.ds_override and not self._in_opt:
                reftype = self.ds_override[-1]
            MemTracker._track(self, reftype, t)

        def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None):
            dev_snap = self._curr_mem_snap.setdefault(winfo.device, dict.fromkeys(self._ref_class, 0))
            dev_snap.setdefault(winfo.reftype, 0)
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)

        def _update_and_maybe_create_winfos(self, t, reftype, update_existing=False):
            # The tracker's own refiling (parameters at a module's first forward, gradients in
            # its hooks) leaves DeepSpeed's storages where this harness put them.
            if not isinstance(reftype, ds_ref):
                for st in get_untyped_storages(t):
                    winfo, _ = self._WINFO.get(st, (None, None))
                    if winfo is not None and isinstance(winfo.reftype, ds_ref):
                        return set()
            return super()._update_and_maybe_create_winfos(t, reftype, update_existing)

        def file_under(self, reftype, tensors):
            """Registers (or refiles) the storages of `tensors` under `reftype`."""
            for t in tensors:
                if t is not None and t.untyped_storage().nbytes() > 0:
                    MemTracker._update_and_maybe_create_winfos(self, t, reftype)

        def note_lazy(self, name, tensors):
            nbytes = sum(b for _st, b in _storages(tensors).values())
            if nbytes > self.ds_lazy.get(name, 0):
                self.ds_lazy[name] = nbytes

    tracker = DeepSpeedMemTracker()
    tracker._ds_init()
    tracker.track_external(engine.module, basic_optimizer, ids)
    tracker._probe_init()
    return tracker


class _Patches:
    """Replaces attributes for the measured step and puts them back."""

    def __init__(self):
        self.saved = []

    def wrap(self, owner, name, make):
        original = getattr(owner, name)
        in_dict = name in vars(owner)
        self.saved.append((owner, name, original, in_dict))
        setattr(owner, name, functools.wraps(original)(make(original)))

    def restore(self):
        for owner, name, original, in_dict in reversed(self.saved):
            if in_dict:  # a class's or module's own attribute
                setattr(owner, name, original)
            else:  # an instance attribute that shadowed the class's method
                delattr(owner, name)
        self.saved.clear()


def _scoped(tracker, reftype=None, phase=None, after=None):
    """A _Patches maker: storages first seen inside the call go under `reftype`, the phase is
    `phase` there, and `after(*args, **kwargs)` runs when it returns."""
    def make(original):
        def wrapper(*args, **kwargs):
            if reftype is not None:
                tracker.ds_override.append(reftype)
            if phase is not None:
                tracker.ds_phase.append(phase)
            try:
                return original(*args, **kwargs)
            finally:
                if phase is not None:
                    tracker.ds_phase.pop()
                if reftype is not None:
                    tracker.ds_override.pop()
                if after is not None:
                    after(*args, **kwargs)
        return wrapper
    return make


def bf16_master_grads(tracker, optimizer, reftype, note=None):
    """A _Patches maker for the inner optimizer's step under BF16_Optimizer: files the master
    partitions' gradients under `reftype` as the step starts. BF16_Optimizer.step sets each one to
    its gradient partition: a view of the accumulation buffer when that is float32 (nothing new),
    else grad_partition.to(float32). `note(name, tensors)`, if given, records their size."""
    def make(original):
        def wrapper(*args, **kwargs):
            accumulated = {t.untyped_storage().data_ptr()
                           for t in optimizer.fp32_groups_gradients_flat}
            grads = [p.grad for p in optimizer.fp32_groups_flat_partition if p.grad is not None
                     and p.grad.untyped_storage().data_ptr() not in accumulated]
            tracker.file_under(reftype, grads)
            if grads and note is not None:
                note("master_gradient", grads)
            return original(*args, **kwargs)
        return wrapper
    return make


def classify_deepspeed(tracker, engine, stage):
    """Installs the phase and category wrappers around DeepSpeed's functions; returns the patches."""
    patches = _Patches()
    optimizer = engine.optimizer
    ref = tracker.reftype
    scoped = functools.partial(_scoped, tracker)
    from torch.distributed._tools.mem_tracker import _MemRefType

    patches.wrap(engine, "backward", scoped(_MemRefType.TEMP, "backward"))
    patches.wrap(engine, "step", scoped(ref("Step Temp"), "step"))
    if type(optimizer).__name__ == "BF16_Optimizer":
        classify_bf16(tracker, engine, patches)
    elif stage == 0:
        classify_stage0(tracker, engine, patches)
    elif stage in (1, 2):
        import deepspeed.runtime.zero.stage_1_and_2 as s12

        def note_buckets(*_a, **_k):
            for dtype, bucket in optimizer.ipg_buckets.items():
                tracker.note_lazy(f"ipg_buckets[{str(dtype).replace('torch.', '')}].buffer", bucket.buffer)

        def note_grads(*_a, **_k):
            tracker.note_lazy("grads_in_partition", [optimizer.grads_in_partition])

        patches.wrap(optimizer, "setup_buckets", scoped(ref("Gradient Buckets"), after=note_buckets))
        patches.wrap(optimizer, "copy_grads_in_partition", scoped(ref("Sharded Grad"), after=note_grads))
        patches.wrap(optimizer, "reduce_ipg_grads", scoped(ref("Reduce Scatter")))
        patches.wrap(s12, "all_gather_dp_groups", scoped(ref("All Gather")))

        def master_grad(original):
            def wrapper(grad_groups_flat, *args, **kwargs):
                tracker.file_under(ref("Master Grad"), grad_groups_flat)
                tracker.note_lazy("master_gradient", grad_groups_flat)
                return original(grad_groups_flat, *args, **kwargs)
            return wrapper

        patches.wrap(optimizer, "unscale_and_clip_grads", master_grad)
    else:
        from deepspeed.runtime.zero.partition_parameters import AllGatherCoalescedHandle, AllGatherHandle
        from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator

        def single_param_gathered(handle, *_a, **_k):
            param = handle._AllGatherHandle__param  # its data: a view of the gathered buffer
            tracker.file_under(ref("Unsharded Param"), [param.data])

        def master_grad_made(sub_group_id, *_a, **_k):
            grad = optimizer.fp32_partitioned_groups_flat[sub_group_id].grad
            tracker.file_under(ref("Master Grad"), [grad])
            tracker.note_lazy("master_gradient", [grad])

        # Gathering: the flat all-gather outputs are made in fetch_sub_module, the parameters'
        # own tensors (copies out of a coalesced gather) in the handles' wait().
        patches.wrap(PartitionedParameterCoordinator, "fetch_sub_module", scoped(ref("All Gather")))
        patches.wrap(AllGatherCoalescedHandle, "wait", scoped(ref("Unsharded Param")))
        patches.wrap(AllGatherHandle, "wait", scoped(ref("Unsharded Param"), after=single_param_gathered))
        patches.wrap(optimizer, "_DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads",
                     scoped(ref("Reduce Scatter")))
        patches.wrap(optimizer, "_prepare_fp32_grad_for_sub_group", scoped(after=master_grad_made))
    return patches


def classify_stage0(tracker, engine, patches):
    """Stage 0: the gradient all-reduce at the end of engine.backward, and the float32 master
    gradients the bf16 wrappers make in their step."""
    import deepspeed.runtime.fp16.fused_optimizer as fused
    import deepspeed.runtime.fp16.unfused_optimizer as unfused

    optimizer = engine.optimizer
    master = tracker.reftype("Master Grad")
    scoped = functools.partial(_scoped, tracker)

    def returned(name, original):  # notes the size of what `original` returns
        def wrapper(*args, **kwargs):
            out = original(*args, **kwargs)
            tracker.note_lazy(name, [out])
            return out
        return wrapper

    # allreduce_gradients -> buffered_allreduce_fallback -> allreduce_no_retain ->
    # allreduce_and_copy -> allreduce_bucket, which flattens each bucket of gradients into a new
    # tensor, all-reduces it and copies it back.
    patches.wrap(engine, "allreduce_gradients", scoped(tracker.reftype("Gradient Allreduce")))
    patches.wrap(engine, "allreduce_bucket", functools.partial(returned, "allreduce_bucket"))
    if type(optimizer).__name__ == "FP16_Optimizer":
        # FP16_Optimizer.step: the flat float32 gradient is made by _flatten_dense_tensors from
        # the per-parameter float32 casts (step_temp), then set as fp32_groups_flat's .grad.
        patches.wrap(fused, "_flatten_dense_tensors",
                     lambda original: scoped(master)(returned("master_gradient", original)))
    elif type(optimizer).__name__ == "FP16_UnfusedOptimizer":
        # FP16_UnfusedOptimizer.step casts each parameter's gradient inline (grad.to(float32)) as
        # its master's .grad, between the group's get_weight_norm and get_global_norm: storages
        # first seen in that span are master gradients.
        span = []  # one entry while the span is open

        def close(*_a, **_k):
            if span:
                span.pop()
                tracker.ds_override.pop()

        def weight_norm(original):
            def wrapper(*args, **kwargs):
                close()
                out = original(*args, **kwargs)
                tracker.ds_override.append(master)
                span.append(True)
                return out
            return wrapper

        def global_norm(original):
            def wrapper(*args, **kwargs):
                close()
                grads = [p.grad for group in optimizer.fp32_groups for p in group]
                tracker.note_lazy("master_gradient", grads)
                return original(*args, **kwargs)
            return wrapper

        patches.wrap(unfused, "get_weight_norm", weight_norm)
        patches.wrap(unfused, "get_global_norm", global_norm)
        patches.wrap(optimizer, "step", scoped(after=close))  # closes it on an early return


def classify_bf16(tracker, engine, patches):
    """BF16_Optimizer (stage 1, bf16, float32 grad_accum_dtype): the all-reduce of the flat
    accumulation buffer at the end of engine.backward, the float32 master gradient its step makes
    when that buffer is not float32, and the all-gather of the updated bf16 partitions."""
    import deepspeed.runtime.bf16_optimizer as bf16

    optimizer = engine.optimizer
    ref = tracker.reftype
    scoped = functools.partial(_scoped, tracker)

    # allreduce_gradients -> buffered_allreduce_fallback (get_grads_for_reduction: the flat
    # accumulation buffer) -> allreduce_no_retain -> allreduce_and_copy -> allreduce_bucket, whose
    # flatten of that one buffer is a view, and whose cast to the communication dtype (the model's
    # bf16 unless communication_data_type is set) is a new tensor, all-reduced and copied back.
    patches.wrap(engine, "allreduce_gradients", scoped(ref("Gradient Allreduce")))
    # BF16_Optimizer.step -> update_lp_params: the master partition copied into this rank's bf16
    # partition, then all_gather_dp_groups fills bf16_groups_flat.
    patches.wrap(bf16, "all_gather_dp_groups", scoped(ref("All Gather")))

    master_grads = bf16_master_grads(tracker, optimizer, ref("Master Grad"), tracker.note_lazy)

    patches.wrap(optimizer.optimizer, "step", master_grads)


def register_buffers(tracker, optimizer, stage):
    """Files the buffers DeepSpeed holds before the step under their categories. Where two share a
    storage the first wins (stage 3 lists the low-precision partition before the master that may
    alias it)."""
    filed = set()
    for _name, category, tensors in buffer_groups(optimizer, stage):
        for t in tensors:
            ptr = t.untyped_storage().data_ptr()
            if t.untyped_storage().nbytes() > 0 and ptr not in filed:
                filed.add(ptr)
                tracker.file_under(tracker.reftype(category), [t])


def category_dict(snap):
    out = {}
    for k, v in snap.items():
        name = getattr(k, "value", k)
        if name != "Total":
            out[NAMES.get(name, name)] = out.get(NAMES.get(name, name), 0) + int(v)
    return out


def read_tracker(tracker, state_bytes):
    peak = tracker.get_tracker_snapshot("peak")
    if len(peak) != 1:
        raise RuntimeError(f"expected one device, the tracker saw {list(peak)}")
    (dev, snap), = peak.items()
    at_peak = split_optimizer(category_dict(snap), state_bytes)
    own_peaks = split_optimizer(category_dict(tracker.category_peaks[dev]), state_bytes)
    keys = {k for k, v in at_peak.items() if v} | {k for k, v in own_peaks.items() if v}
    keys |= {"parameters", "buffers", "gradients", "activations", "temp", "optimizer_states", "other"}
    return {
        "peak_bytes": int(snap["Total"]),
        "at_peak": in_category_order(at_peak, keys, ORDER),
        "category_peaks": in_category_order(own_peaks, keys, ORDER),
        "peak_module": tracker.peak_where[0],
        "peak_phase": tracker.peak_where[1],
        "sdpa_kernel": ",".join(sorted(tracker.sdpa_kernels)),
    }


# ----------------------------------------------------------------------------------------------
# DeepSpeed's collectives


# nccl-tests' traits (src/*.cu, doc/PERFORMANCE.md), as documents/collectives.hpp has them: which
# tensor is a call's "size" (the per-rank buffer, or the whole gathered / scattered buffer) and
# the bus factor that turns a size into the bytes one rank sends on a ring of n ranks.
def _bus_all_reduce(n):
    return 2 * (n - 1) / n


def _bus_ring(n):
    return (n - 1) / n


def _bus_one(_n):
    return 1.0


def _nbytes(t):
    return t.numel() * t.element_size()


def _list_bytes(ts):
    return sum(_nbytes(t) for t in ts)


# deepspeed.comm function -> (the corpus's collective name, size of the call from its arguments,
# bus factor). The functions DeepSpeed's ZeRO calls through deepspeed.comm (reduce_scatter_fn and
# allgather_fn end in reduce_scatter_tensor / all_gather_into_tensor or their list forms).
COLLECTIVES = {
    "all_reduce": ("all_reduce", lambda a, k: _nbytes(k.get("tensor", a[0] if a else None)),
                   _bus_all_reduce),
    "all_reduce_coalesced": ("all_reduce", lambda a, k: _list_bytes(k.get("tensors", a[0] if a else [])),
                             _bus_all_reduce),
    "reduce": ("reduce", lambda a, k: _nbytes(k.get("tensor", a[0] if a else None)), _bus_one),
    "broadcast": ("broadcast", lambda a, k: _nbytes(k.get("tensor", a[0] if a else None)), _bus_one),
    "all_gather_into_tensor": ("all_gather",
                               lambda a, k: _nbytes(k.get("output_tensor", a[0] if a else None)),
                               _bus_ring),
    "all_gather": ("all_gather", lambda a, k: _list_bytes(k.get("tensor_list", a[0] if a else [])),
                   _bus_ring),
    "all_gather_coalesced": ("all_gather",
                             lambda a, k: _list_bytes(k.get("output_tensors", a[0] if a else [])),
                             _bus_ring),
    "reduce_scatter_tensor": ("reduce_scatter",
                              lambda a, k: _nbytes(k.get("tensor", a[1] if len(a) > 1 else None)),
                              _bus_ring),
    "reduce_scatter": ("reduce_scatter",
                       lambda a, k: _list_bytes(k.get("input_list", a[1] if len(a) > 1 else [])),
                       _bus_ring),
}


class CollectiveCounter:
    """Counts the collectives DeepSpeed asks deepspeed.comm for while active: calls, nccl-tests
    size and bytes sent per rank, by collective. It counts what the engine requests, not how the
    process group carries it out (gloo here, NCCL on GPUs): the same request on either."""

    def __init__(self, world_size):
        self.world_size = world_size
        self.active = False
        self.counts = {}
        self.patches = _Patches()
        # The functions live in deepspeed.comm.comm; the package re-exports them, and ZeRO calls
        # them through the package ("from deepspeed import comm as dist"): both names are
        # wrapped. A call reaches one wrapper: the package's name holds the original function,
        # whose own calls go through the module's names (reduce_scatter_fn ->
        # reduce_scatter_tensor).
        import deepspeed.comm as ds_package
        from deepspeed.comm import comm as ds_module
        for owner in (ds_module, ds_package):
            for fn, (name, size_of, bus) in COLLECTIVES.items():
                if hasattr(owner, fn):
                    self.patches.wrap(owner, fn, functools.partial(self._counted, name, size_of, bus))

    def _counted(self, name, size_of, bus, original):
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if self.active:
                size = size_of(args, kwargs)
                c = self.counts.setdefault(name, {"calls": 0, "size_bytes": 0, "bytes_sent": 0.0})
                c["calls"] += 1
                c["size_bytes"] += size
                c["bytes_sent"] += size * bus(self.world_size)
            return original(*args, **kwargs)
        return wrapper

    def record(self):
        return {k: dict(v, bytes_sent=round(v["bytes_sent"])) for k, v in sorted(self.counts.items())}


# ----------------------------------------------------------------------------------------------
# One case, one rank


def train_step(engine, ids):
    """DeepSpeed's step: forward with the model's loss, engine.backward, engine.step (which
    zeroes the gradients itself)."""
    loss = engine(input_ids=ids, labels=ids, use_cache=False).loss
    engine.backward(loss)
    engine.step()
    return float(loss.detach())


def check_wrapping(engine, optimizer, client_optimizer, case):
    """The basic optimizer (DeepSpeedEngine.basic_optimizer), once checked: the client's, or the
    FusedAdam DeepSpeed built from the config; wrapped by stages 1/2/3's ZeRO optimizer (stage 1,
    bf16 with a float32 grad_accum_dtype: BF16_Optimizer), at stage 0 by FP16_Optimizer (a
    FusedAdam) or FP16_UnfusedOptimizer (any other) under bf16 and by nothing under fp32
    (_do_optimizer_sanity_check, _configure_fp16_optimizer, _configure_bf16_optimizer)."""
    basic = engine.basic_optimizer
    if client_optimizer is not None:
        ok = basic is client_optimizer
    else:
        ok = type(basic).__name__ == "FusedAdam"
    if case["stage"] == 0 and case["precision"] == "fp32":
        ok = ok and optimizer is basic
    elif case["stage"] == 0:
        wrapper = "FP16_Optimizer" if type(basic).__name__ == "FusedAdam" else "FP16_UnfusedOptimizer"
        ok = ok and type(optimizer).__name__ == wrapper and optimizer.optimizer is basic
    else:
        # Stage 1 under bf16 with a float32 grad_accum_dtype gets BF16_Optimizer, every other
        # stage 1/2/3 case its ZeRO optimizer.
        bf16 = case.get("grad_accum_dtype") == GRAD_ACCUM_FP32 and case["precision"] == "bf16-mixed"
        ok = (ok and (type(optimizer).__name__ == "BF16_Optimizer") == bf16
              and getattr(optimizer, "optimizer", None) is basic)
    if engine.optimizer is not optimizer or not ok:
        raise RuntimeError(f"unexpected optimizer wrapping: {type(optimizer).__name__} over "
                           f"{type(basic).__name__}")
    return basic


def immediate_grad_update(optimizer):
    """BF16_Optimizer's immediate_grad_update (the bf16 config's, default false): whether a
    gradient hook adds each low-precision .grad into the accumulation buffer and drops it
    (accumulate_hp_grads_and_remove_lp) rather than backward_epilogue adding them all at the end of
    the backward, the .grad kept to the step's zero_grad. None for the other wrappers."""
    if type(optimizer).__name__ != "BF16_Optimizer":
        return None
    return bool(optimizer.immediate_grad_update)


def build_engine(case):
    """deepspeed.initialize for a case, with the client AdamW or the config's optimizer section:
    (engine, the optimizer it returned, the basic optimizer, the config, parameter count)."""
    import deepspeed

    model = build_model(case["config"], case["checkpointing"])
    params = parameter_count(model)
    client_optimizer = make_optimizer(model) if case["optimizer_source"] == "client" else None
    config = deepspeed_config(case["stage"], case["precision"], case["micro_batch"], case["buckets"],
                              case["config"], case["optimizer_source"], case["grad_accum_dtype"])
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=client_optimizer,
                                                   config=json.loads(json.dumps(config)))
    basic = check_wrapping(engine, optimizer, client_optimizer, case)
    return engine, optimizer, basic, config, params


def measure_case(rank, case):
    stage, source = case["stage"], case["optimizer_source"]
    engine, optimizer, basic, config, params = build_engine(case)
    buffers, aliases = buffer_sizes(optimizer, stage, basic, source)
    ids = make_batch(case["config"], case["seq_len"], case["micro_batch"], rank)
    for _ in range(WARMUP_STEPS):
        train_step(engine, ids)
    gc.collect()
    tracker = make_tracker(engine, basic, ids)
    register_buffers(tracker, optimizer, stage)
    tracker.ds_lazy.update(buffer_sizes(optimizer, stage, basic, source)[0])
    patches = classify_deepspeed(tracker, engine, stage)
    counter = CollectiveCounter(WORLD_SIZE)
    try:
        with tracker:
            counter.active = True
            loss = train_step(engine, ids)
            counter.active = False
    finally:
        patches.restore()
        counter.patches.restore()
    for name, nbytes in buffer_sizes(optimizer, stage, basic, source)[0].items():
        tracker.ds_lazy[name] = max(nbytes, tracker.ds_lazy.get(name, 0))
    record = {
        "id": case_id(case),
        "wrapper": wrapper_name(stage),
        "world_size": WORLD_SIZE,
        "config": case["config"],
        "model_class": STEP_CONFIGS[case["config"]]["architectures"][0],
        "params": params,
        "seq_len": case["seq_len"],
        "micro_batch": case["micro_batch"],
        "precision": case["precision"],
        "mixed_precision_mechanism": "deepspeed-bf16" if case["precision"] == "bf16-mixed" else "none",
        "attention": "flash",
        "loss": "upcast",
        "checkpointing": case["checkpointing"],
        "optimizer": "adamw",
        "optimizer_source": source,
        "grad_accum_dtype": case["grad_accum_dtype"],
        **read_tracker(tracker, optimizer_state_bytes(basic)),
        "loss_value": round(loss, 4),
        "deepspeed_config": config,
        "deepspeed_optimizer": type(optimizer).__name__,
        "immediate_grad_update": immediate_grad_update(optimizer),
        "deepspeed_buffers": buffers,
        "deepspeed_buffers_in_step": dict(sorted(tracker.ds_lazy.items())),
        "deepspeed_buffer_aliases": aliases,
        "optimizer_states_on_master": states_on_master(optimizer, stage, basic, engine.module),
        "collectives": counter.record(),
    }
    del tracker, patches, engine, optimizer, basic
    gc.collect()
    return record


def worker_main(out_path, only, buckets):
    """Runs every case on this rank and writes the records (format of measure_steps.py's)."""
    import logging

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    import deepspeed
    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.WARNING)
    rank = int(os.environ.get("RANK", "0"))
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    linear = torch.nn.functional.linear
    records, errors = [], []
    for case in case_grid(only, buckets):
        try:
            samples = [measure_case(rank, case) for _ in range(REPEATS)]
            records.append(dict(samples[0], peak_bytes_samples=[r["peak_bytes"] for r in samples]))
        except Exception as e:  # record it and go on with the other cases
            errors.append({"id": case_id(case), "error": f"{type(e).__name__}: {e}".splitlines()[0][:500]})
            if len(errors) == 1:
                import traceback
                traceback.print_exc()
        # Stage 3 swaps in its memory-efficient linear for the whole process; each case gets its own.
        torch.nn.functional.linear = linear
        torch.distributed.barrier()
        print(f"rank {rank}: {case_id(case)} done", flush=True)
    with open(out_path, "w") as f:
        json.dump({"rank": rank, "records": records, "errors": errors}, f)
    torch.distributed.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# Launcher


def launch(tmpdir, only, buckets):
    """Runs both ranks to the end; returns (exit status, [per-rank result files], log file)."""
    stem = os.path.join(tmpdir, f"deepspeed-w{WORLD_SIZE}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={WORLD_SIZE}", os.path.abspath(__file__), "--worker",
           "--worker-out", stem + "-r{rank}.json", "--buckets", buckets]
    for name in only or []:
        cmd += ["--only", name]
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    with open(stem + ".log", "w") as log:
        proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc.returncode, [stem + f"-r{r}.json" for r in range(WORLD_SIZE)], stem + ".log"


def run_all(only, buckets):
    with tempfile.TemporaryDirectory() as tmpdir:
        rc, files, log = launch(tmpdir, only, buckets)
        if rc != 0 or not all(os.path.exists(p) for p in files):
            with open(log) as f:
                lines = [ln for ln in f.read().splitlines() if ln.strip()]
            print("\n".join(lines[-40:]))
            return [], {"deepspeed-w2": f"exit {rc}: " + (lines[-1] if lines else "no output")}, []
        return merge_ranks(files)


def versions():
    import importlib.metadata

    return {**steps_versions(), "deepspeed": importlib.metadata.version("deepspeed")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/costmodel/data/oracle_deepspeed.json")
    ap.add_argument("--only", action="append", choices=[wrapper_name(s) for s in STAGES],
                    help="run only these stages (repeatable)")
    ap.add_argument("--buckets", choices=BUCKETS, default="default",
                    help="ZeRO bucket sizes: DeepSpeed's defaults (oracle_deepspeed.json), "
                         "transformers' auto values (oracle_deepspeed_hf_auto.json), or the "
                         "executor's tiny GPT-2 with its planned bucket "
                         "(oracle_deepspeed_executor.json)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main(args.worker_out.format(rank=os.environ.get("RANK", "0")), args.only,
                    args.buckets)
        return 0

    started = time.time()
    cases, failures, warnings_ = run_all(args.only, args.buckets)
    command = command_line(args, GENERATED_BY)
    if args.buckets != "default":
        command += f" --buckets {args.buckets}"
    configs = ({EXECUTOR_CONFIG: STEP_CONFIGS[EXECUTOR_CONFIG]} if args.buckets == "executor"
               else CONFIGS)
    write_corpus(args.out, cases, failures, command, GENERATED_BY, versions(), configs)
    return report(args.out, cases, failures, warnings_, started)


if __name__ == "__main__":
    sys.exit(main())
