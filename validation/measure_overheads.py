#!/usr/bin/env python3
# Over 800 lines: one corpus, one command: the models, the hooks that measure and the writer stay
# in the one script that regenerates the corpus.
"""Measure the host-side (CPU) overheads a training step pays besides its kernels, with the frameworks' own code.

What it measures
    1. op_dispatch_us: the host time of one PyTorch eager op on tiny float32 CPU tensors (so the
       kernel itself costs next to nothing): ``a + b`` and ``a * b`` on 1x8, ``F.linear`` of 1x8
       by an 8x8 weight with bias, ``F.layer_norm`` over 8, ``torch.relu`` and ``a.sum()``.
       Each op's time is op_dispatch_by_op_us; op_dispatch_us is the median over the ops.
       op_dispatch_autograd_by_op_us repeats it with inputs that require grad (autograd records
       a node per op), op_dispatch_autograd_us is their median.

    2. flavours: a framework's extra host time per step, beyond the same module run bare, split
       into a part per sharding unit and a part per parameter tensor. The model is a root module
       holding U blocks; a block (the sharding unit, standing in for a transformer block) is L
       ``nn.Linear(8, 8)`` layers in sequence, with bias off or on (L or 2L parameter tensors).
       The grid is U in UNITS x L in LINEARS_PER_UNIT x bias off/on (24 models). The flavours:

       - "ddp": ``torch.nn.parallel.DistributedDataParallel`` with its defaults (bucket_cap_mb 25,
         gradient_as_bucket_view False): its forward's bookkeeping, its per-parameter autograd
         hooks and the bucket's all-reduce. DDP has no sharding unit: its per-unit terms should
         come out near zero;
       - "fsdp1": ``torch.distributed.fsdp.FullyShardedDataParallel`` with
         ``ModuleWrapPolicy({Block})`` (one FSDP unit per block, the root wraps the rest),
         use_orig_params False, its defaults otherwise. NOTE: at world size 1 FSDP1 itself
         replaces any sharding strategy by NO_SHARD (``_init_utils._init_core_state``: "FSDP is
         switching to use NO_SHARD ... since the world size is 1"), so this measures FSDP1's hooks,
         flat parameters and gradient all-reduce, without the unshard/reshard copies of FULL_SHARD;
         the record says which strategy ran (config.sharding_strategy);
       - "fsdp2": ``torch.distributed.fsdp.fully_shard`` on each block, then on the root, its
         defaults (reshard_after_forward True: each block is gathered again in backward);
       - "deepspeed": DeepSpeed's ZeRO-3 engine, ``deepspeed.initialize(model=..., optimizer=
         torch.optim.SGD(lr=0), config=DS_CONFIG)``: ZeRO stage 3 with
         ``stage3_param_persistence_threshold: 0`` so that every parameter is partitioned and
         gathered by the per-submodule hooks as the large tensors of a real model are (with the
         default threshold, 1e5 elements, all of these tiny parameters would stay persistent and
         never be gathered: that variant is measured too, on a smaller grid, as
         default_persistence), DeepSpeed's defaults otherwise (memory_efficient_linear,
         overlap_comm, prefetching). ZeRO-3 hooks every submodule (each Linear as well as each
         block and the root), so its extra time is also fitted with a term per submodule;
       - "deepspeed_zero12": DeepSpeed's ZeRO stage 1/2 engine, initialized as "deepspeed" is
         (SGD with lr 0) with DS_CONFIG_ZERO2: ZeRO stage 2, DeepSpeed's defaults otherwise
         (reduce_bucket_size, overlap_comm, contiguous_gradients). Stage 2 adds to stage 1 a
         gradient hook per parameter tensor and the reduce buckets those hooks fill in backward;
         parameters stay whole (no per-submodule hooks, no memory_efficient_linear), so the
         plain unit+tensor fit is the one to use. Stage 1 (DS_CONFIG_ZERO1), which reduces the
         gradients once after backward, is measured in the same process on the same grid and
         recorded under deepspeed_zero12.stage1. The config records the stage, the optimizer class
         DeepSpeed put in place and its bucket settings.

       All run in one process on a gloo process group of world size 1 (MASTER_ADDR/PORT set in
       the environment), so no communication latency is measured, only the framework's host work
       (hooks, bookkeeping, copies in and out of its tiny flat buffers, the single-rank
       collectives). One intra-op thread (``torch.set_num_threads(1)``), float32, input 1x8.

    3. host_optimizer: the rate of ``optimizer.step()`` on float32 CPU parameters, N =
       OPT_TENSORS x OPT_TENSOR_NUMEL elements (8 x 2^22 = 2^25), gradients set (random, scale
       1e-3): ``deepspeed.ops.adam.DeepSpeedCPUAdam(adamw_mode=True)`` (as ZeRO-Offload steps the
       fp32 master partition; JIT-built with the system C++ compiler on first use, OpenMP),
       ``torch.optim.AdamW(foreach=False)`` (the per-tensor loop), ``torch.optim.AdamW(foreach=True)``
       and, for the record, ``torch.optim.AdamW(fused=True)``; all with lr 1e-3, weight decay
       0.01. torch_adamw_default records what ``torch.optim.AdamW`` picks with neither foreach nor
       fused given, on these CPU tensors (``torch.optim.optimizer._default_to_fused_or_foreach``):
       that is what FSDP's CPUOffload steps with. Each runs with all cores: OMP_NUM_THREADS and
       ``torch.set_num_threads`` set to ``os.cpu_count()`` (DeepSpeed's op has its own OpenMP
       runtime, which reads OMP_NUM_THREADS). Gparams_per_s = N / seconds / 1e9.

How it measures
    Times are ``time.perf_counter`` (wall) around the measured call, in microseconds (the
    optimizers in seconds). The host these corpora are made on may be shared: other work on it
    slows every number here, for a few seconds to minutes at a time. So everything is measured
    in PASSES passes spread over the run, and each number is the median of the pass with the
    quietest window (the smallest median). For the flavours the first pass warms up WARMUP rounds,
    later ones REWARM, each then measures MEASURED rounds. All passes' medians are in the samples,
    and the host's load average before and after each part in host.loadavg_by_part.

    op dispatch: a sample is a batch of OP_BATCH calls timed together, divided by OP_BATCH (the
    timer's own cost spread over the batch); OP_WARMUP batches, then OP_MEASURED measured, in a
    process of its own per pass (the passes interleaved with the optimizers' below).

    flavours: each flavour runs in its own process. For each model of the grid two copies with
    the same shapes and initial values are built, one left bare and one wrapped; in a round the
    bare and the wrapped model each run one step, alternately, so that both see the same
    conditions of the host. A step is ``loss = model(x).sum()`` timed as forward, then
    ``loss.backward()`` (DeepSpeed: ``engine.backward(loss)``) timed as backward, then, untimed,
    the gradients dropped (``zero_grad(set_to_none=True)``; DeepSpeed: ``engine.step()``, which
    steps the SGD with lr 0 and zeroes its partitioned gradients). Python's garbage collector is
    off while timing (collected before). All models of a flavour are built first; each pass then
    runs every model (in reverse order every other pass). Per model and phase the pass with the
    smallest wrapped median is kept, its bare median from the same rounds. ZeRO-3 replaces
    ``torch.nn.functional.linear`` for the whole process by its memory_efficient_linear; the
    harness puts the original back at once after each ``deepspeed.initialize`` and switches to
    ZeRO-3's one for the engines' steps only.

    The framework's extra time is wrapped minus bare median, per phase; over the grid it is fitted
    by least squares to

        extra = step + a * units + c * tensors

    (forward and backward separately): forward_unit_us = a, forward_tensor_us = c, and the
    per-step constant (the root's own hooks, DDP's per-step bookkeeping) as forward_step_us; the
    same for backward. Each fit records its residuals' RMS and R^2. fit_with_submodules adds a
    term per Linear submodule (extra = step + a*units + s*submodules + c*tensors; bias off/on
    separates submodules from tensors): for DeepSpeed it gives the cost per hooked submodule
    (forward_submodule_us, backward_submodule_us), for the others it should be near zero.
    ZeRO-3's cost follows its submodules, so for it the two-term fit leaves large residuals (its
    unit term then stands for the grid's mix of 2-8 Linear layers per block): fit_with_submodules
    is the one to use where the number of submodules per unit is known.
    fit_p10 and fit_thread_cpu_median repeat the fit on the kept pass's 10th percentile and on
    the median of the calling thread's CPU time (``time.thread_time``), for the record.

    host_optimizer: each optimizer runs in its own process per pass (the passes interleaved
    across the optimizers and op dispatch): OPT_WARMUP steps (the first makes the states; the
    next ones let the timings settle: foreach's first steps after that were seen up to 4x slower,
    while its per-step temporaries still cost fresh pages), then OPT_MEASURED timed steps;
    step_s_median is the median of the quietest pass.

Output
    A JSON file (``--out``): schema_version, command, versions (python, torch, deepspeed),
    host (CPU model name from /proc/cpuinfo, torch's intra-op threads for parts 1-2, the load
    averages), method (the parameters above), op_dispatch_us and its per-op times, flavours {ddp,
    fsdp1, fsdp2, deepspeed, deepspeed_zero12: the four per-unit/per-tensor microseconds, the
    per-step constants, the fits, the configuration that ran} (a flavour that fails carries
    "error" and no numbers), host_optimizer, and samples: per model and flavour the kept pass's
    statistics of bare and wrapped forward and backward (microseconds) and every pass's medians.

    ``--update FILE`` with ``--only FLAVOUR`` (repeatable; flavours only) measures just those
    flavours and merges each into FILE's "flavours", leaving every other key of FILE with the value
    it had (the top-level command, host, samples, elapsed_s and the other flavours included). A
    flavour merged this way carries its own record: command (the exact command that measured
    it), versions, host (with the load averages of its run), method, samples (as the top-level
    samples, for this flavour only) and elapsed_s. FILE must not have the flavour yet, unless
    ``--replace`` is given (the flavours already shipped are tied to the hardware profiles, and
    are not to be measured again on their own). If the measurement fails, FILE is left as it was.

    The shipped corpus was made in two runs: the full run (its top-level command) and then
    deepspeed_zero12, added by --update (flavours.deepspeed_zero12.command).

Usage
    python validation/measure_overheads.py --out tests/costmodel/data/oracle_overheads.json
    python validation/measure_overheads.py --only deepspeed_zero12 \\
        --update tests/costmodel/data/oracle_overheads.json
"""

import argparse
import gc
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time

GENERATED_BY = "validation/measure_overheads.py"
SCHEMA_VERSION = 1
WIDTH = 8
UNITS = (1, 2, 4, 8)
LINEARS_PER_UNIT = (2, 4, 8)
BIASES = (False, True)
# DeepSpeed with its default persistence threshold, for the record: a smaller grid.
DEFAULT_PERSISTENCE_GRID = {"units": (1, 4), "linears_per_unit": (2, 8), "bias": BIASES}
PASSES = 5
WARMUP = 50
REWARM = 10
MEASURED = 40
OP_BATCH = 100
OP_WARMUP = 50
OP_MEASURED = 200
FLAVOURS = ("ddp", "fsdp1", "fsdp2", "deepspeed", "deepspeed_zero12")
DEEPSPEED_FLAVOURS = ("deepspeed", "deepspeed_zero12")
HOST_OPTIMIZERS = ("deepspeed_cpu_adam", "torch_adamw_foreach_false", "torch_adamw_foreach_true",
                   "torch_adamw_fused")
PARTS = ("dispatch",) + FLAVOURS + HOST_OPTIMIZERS
REPEATED = ("dispatch",) + HOST_OPTIMIZERS  # a process per pass, the passes interleaved
PART_TIMEOUT_S = 480
DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "zero_allow_untested_optimizer": True,
}
DS_CONFIG_DEFAULT_PERSISTENCE = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 3},
    "zero_allow_untested_optimizer": True,
}
# ZeRO stages 1 and 2 ("deepspeed_zero12"): stage 2 is the flavour's numbers, stage 1 is recorded
# beside it. DeepSpeed's defaults otherwise (reduce buckets, overlap_comm, contiguous_gradients).
DS_CONFIG_ZERO2 = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 2},
    "zero_allow_untested_optimizer": True,
}
DS_CONFIG_ZERO1 = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 1},
    "zero_allow_untested_optimizer": True,
}
OPT_TENSORS = 8
OPT_TENSOR_NUMEL = 1 << 22
OPT_WARMUP = 3
OPT_MEASURED = 7


def us(seconds):
    return round(seconds * 1e6, 3)


def step_stats(wall, cpu=None):
    """A phase's statistics over one pass's rounds, in microseconds: wall time's 10th percentile,
    quartiles and median (and the median of the calling thread's CPU time)."""
    q = statistics.quantiles(wall, n=4)
    out = {"p10": us(statistics.quantiles(wall, n=10)[0]), "q1": us(q[0]),
           "median": us(statistics.median(wall)), "q3": us(q[2])}
    if cpu is not None:
        out["thread_cpu_median"] = us(statistics.median(cpu))
    return out


def rounds(pass_index):
    return (WARMUP if pass_index == 0 else REWARM), MEASURED


# ----------------------------------------------------------------------------------------------
# Part 1: op dispatch


def measure_dispatch():
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)

    def ops(requires_grad):
        a = torch.randn(1, WIDTH, requires_grad=requires_grad)
        b = torch.randn(1, WIDTH, requires_grad=requires_grad)
        w = torch.randn(WIDTH, WIDTH, requires_grad=requires_grad)
        bias = torch.randn(WIDTH, requires_grad=requires_grad)
        g = torch.ones(WIDTH, requires_grad=requires_grad)
        return {
            "add_1x8": lambda: a + b,
            "mul_1x8": lambda: a * b,
            "linear_1x8_8x8_bias": lambda: F.linear(a, w, bias),
            "layer_norm_1x8": lambda: F.layer_norm(a, (WIDTH,), g, bias),
            "relu_1x8": lambda: torch.relu(a),
            "sum_1x8": lambda: a.sum(),
        }

    def time_op(fn):
        samples = []
        for i in range(OP_WARMUP + OP_MEASURED):
            t0 = time.perf_counter()
            for _ in range(OP_BATCH):
                fn()
            t = (time.perf_counter() - t0) / OP_BATCH
            if i >= OP_WARMUP:
                samples.append(t)
        return step_stats(samples)

    out = {"no_grad": {}, "autograd": {}}
    gc.collect()
    gc.disable()
    try:
        for requires_grad in (False, True):
            mode = "autograd" if requires_grad else "no_grad"
            for name, fn in ops(requires_grad).items():
                out[mode][name] = time_op(fn)
    finally:
        gc.enable()
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "dispatch": out}


def summarise_dispatch(passes):
    """{mode: {op: the quietest pass's median}} and the per-op record of every pass."""
    times, record = {}, {}
    for mode in passes[0]["dispatch"]:
        times[mode], record[mode] = {}, {}
        for name in passes[0]["dispatch"][mode]:
            stats = [p["dispatch"][mode][name] for p in passes]
            kept = min(stats, key=lambda s: s["median"])
            times[mode][name] = kept["median"]
            record[mode][name] = {"kept": kept, "pass_medians": [s["median"] for s in stats]}
    return times, record


# ----------------------------------------------------------------------------------------------
# Part 2: the flavours


def build_model(units, linears, bias):
    import torch
    from torch import nn

    class Block(nn.Module):
        """The sharding unit: `linears` Linear(8, 8) layers in sequence."""

        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH, bias=bias) for _ in range(linears))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(units))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    torch.manual_seed(0)
    return Model(), Block


class Runner:
    """One model's step: forward() -> loss, backward(loss), drop_grads(); enter() before each step
    (DeepSpeed: puts in place the torch.nn.functional.linear that model runs with)."""

    def __init__(self, forward, backward, drop_grads, enter=None):
        self.forward, self.backward, self.drop_grads = forward, backward, drop_grads
        self.enter = enter or (lambda: None)


def module_runner(model, x, enter=None):
    return Runner(lambda: model(x).sum(), lambda loss: loss.backward(),
                  lambda: model.zero_grad(set_to_none=True), enter)


def time_interleaved(runners, pass_index):
    """One pass: the runners' steps alternately (one step of each per round); returns each
    runner's {phase: step_stats}."""
    warmup, measured = rounds(pass_index)
    wall = [{"forward": [], "backward": []} for _ in runners]
    cpu = [{"forward": [], "backward": []} for _ in runners]
    gc.collect()
    gc.disable()
    try:
        for i in range(warmup + measured):
            for k, r in enumerate(runners):
                r.enter()
                c0, t0 = time.thread_time(), time.perf_counter()
                loss = r.forward()
                c1, t1 = time.thread_time(), time.perf_counter()
                r.backward(loss)
                c2, t2 = time.thread_time(), time.perf_counter()
                r.drop_grads()
                if i >= warmup:
                    wall[k]["forward"].append(t1 - t0)
                    wall[k]["backward"].append(t2 - t1)
                    cpu[k]["forward"].append(c1 - c0)
                    cpu[k]["backward"].append(c2 - c1)
    finally:
        gc.enable()
    return [{phase: step_stats(w[phase], c[phase]) for phase in w} for w, c in zip(wall, cpu)]


def build_case(flavour, units, linears, bias, x, ds_config, original_linear):
    """The bare and the wrapped model of these shapes; returns ([bare, wrapped runner], info)."""
    import torch

    bare_model, _ = build_model(units, linears, bias)
    model, block_cls = build_model(units, linears, bias)
    if flavour == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model)
        info = {"bucket_cap_mb": 25, "gradient_as_bucket_view": wrapped.gradient_as_bucket_view}
        return [module_runner(bare_model, x), module_runner(wrapped, x)], info
    if flavour == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        wrapped = FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({block_cls}),
                                           device_id=torch.device("cpu"))
        fsdp_modules = [m for m in wrapped.modules() if isinstance(m, FullyShardedDataParallel)]
        info = {"sharding_strategy": str(wrapped.sharding_strategy).split(".")[-1],
                "fsdp_modules": len(fsdp_modules), "use_orig_params": False}
        return [module_runner(bare_model, x), module_runner(wrapped, x)], info
    if flavour == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        info = {"fully_shard_modules": len(model.blocks) + 1, "reshard_after_forward": True}
        return [module_runner(bare_model, x), module_runner(model, x)], info
    if flavour in DEEPSPEED_FLAVOURS:
        import deepspeed

        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        try:
            engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                   config=json.loads(json.dumps(ds_config)))
            ds_linear = torch.nn.functional.linear  # ZeRO-3's memory_efficient_linear
        finally:
            torch.nn.functional.linear = original_linear
        expected = ds_config["zero_optimization"]["stage"]
        if engine.zero_optimization_stage() != expected:
            raise RuntimeError(f"ZeRO stage {engine.zero_optimization_stage()}, expected {expected}")
        if flavour == "deepspeed_zero12":
            info = {"zero_stage": expected, "deepspeed_optimizer": type(engine.optimizer).__name__}
            for name in ("zero_reduce_bucket_size", "zero_allgather_bucket_size", "zero_overlap_comm",
                         "zero_contiguous_gradients", "zero_reduce_scatter"):
                getter = getattr(engine, name, None)
                if getter is not None:
                    info[name[len("zero_"):]] = getter()
            return [module_runner(bare_model, x),
                    Runner(lambda: engine(x).sum(), engine.backward, engine.step)], info

        def use(fn):
            def enter():
                torch.nn.functional.linear = fn
            return enter

        info = {"deepspeed_optimizer": type(engine.optimizer).__name__,
                "persistent_parameters": sum(1 for p in engine.module.parameters()
                                             if getattr(p, "ds_persist", False)),
                "hooked_submodules": sum(1 for _ in engine.module.modules()),
                "memory_efficient_linear": ds_linear is not original_linear}
        return [module_runner(bare_model, x, use(original_linear)),
                Runner(lambda: engine(x).sum(), engine.backward, engine.step, use(ds_linear))], info
    raise ValueError(flavour)


def case_grid(grid=None):
    grid = grid or {"units": UNITS, "linears_per_unit": LINEARS_PER_UNIT, "bias": BIASES}
    for units in grid["units"]:
        for linears in grid["linears_per_unit"]:
            for bias in grid["bias"]:
                yield units, linears, bias


def measure_flavour(flavour):
    import logging

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if flavour in DEEPSPEED_FLAVOURS:
        import deepspeed
        from deepspeed.utils import logger as ds_logger

        ds_logger.setLevel(logging.WARNING)
        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo", rank=0, world_size=1)
    original_linear = torch.nn.functional.linear
    variants = [("main", DS_CONFIG, None)]
    if flavour == "deepspeed":
        variants.append(("default_persistence", DS_CONFIG_DEFAULT_PERSISTENCE, DEFAULT_PERSISTENCE_GRID))
    if flavour == "deepspeed_zero12":
        variants = [("main", DS_CONFIG_ZERO2, None), ("stage1", DS_CONFIG_ZERO1, None)]
    x = torch.randn(1, WIDTH)
    cases, errors = [], []

    def fail(case, e):
        errors.append({**case, "error": f"{type(e).__name__}: {e}".splitlines()[0][:500]})
        if len(errors) == 1:
            import traceback
            traceback.print_exc()

    for variant, ds_config, grid in variants:
        for units, linears, bias in case_grid(grid):
            case = {"variant": variant, "units": units, "linears_per_unit": linears, "bias": bias,
                    "submodules": units * linears, "tensors": units * linears * (2 if bias else 1)}
            try:
                runners, info = build_case(flavour, units, linears, bias, x, ds_config, original_linear)
                cases.append({"case": case, "runners": runners, "info": info, "passes": []})
            except Exception as e:  # record it and go on
                fail(case, e)
    for p in range(PASSES):
        started = time.time()
        for c in (cases if p % 2 == 0 else reversed(cases)):
            if c["runners"] is None:
                continue
            try:
                c["passes"].append(time_interleaved(c["runners"], p))
            except Exception as e:
                fail(c["case"], e)
                c["runners"] = None
            finally:
                torch.nn.functional.linear = original_linear
        print(f"{flavour}: pass {p} done in {time.time() - started:.0f} s", flush=True)
    records = []
    for c in cases:
        if c["runners"] is None:
            continue
        record = {**c["case"], "info": c["info"], "bare_us": {}, "wrapped_us": {}, "pass_medians": {}}
        for phase in ("forward", "backward"):
            kept = min(c["passes"], key=lambda t: t[1][phase]["median"])
            record["bare_us"][phase] = kept[0][phase]
            record["wrapped_us"][phase] = kept[1][phase]
            record["pass_medians"][phase] = [[t[0][phase]["median"], t[1][phase]["median"]]
                                             for t in c["passes"]]
        records.append(record)
    dist.destroy_process_group()
    return {"records": records, "errors": errors}


def fit(records, phase, with_submodules=False, stat="median"):
    """Least squares of (wrapped - bare) `stat` on [1, units, (submodules,) tensors]."""
    import numpy as np

    cols = ["step", "unit"] + (["submodule"] if with_submodules else []) + ["tensor"]
    rows, y = [], []
    for r in records:
        rows.append([1.0, r["units"]] + ([r["submodules"]] if with_submodules else []) + [r["tensors"]])
        y.append(r["wrapped_us"][phase][stat] - r["bare_us"][phase][stat])
    a, y = np.array(rows, dtype=float), np.array(y)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    resid = y - a @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return ({c: round(float(v), 3) for c, v in zip(cols, coef)},
            {"residual_rms_us": round(float(np.sqrt((resid ** 2).mean())), 3),
             "r2": round(1.0 - float((resid ** 2).sum()) / ss_tot, 5) if ss_tot > 0 else None,
             "extra_us_range": [round(float(y.min()), 3), round(float(y.max()), 3)]})


def summarise_flavour(flavour, result):
    """The flavour's entry in "flavours" and its samples."""
    by_variant = {}
    for r in result["records"]:
        by_variant.setdefault(r["variant"], []).append(r)
    errors = result["errors"]

    def entry(records, variant_errors, grid=None):
        n_cases = sum(1 for _ in case_grid(grid))
        if len(records) < n_cases:
            first = variant_errors[0]["error"] if variant_errors else "missing cases"
            return {"error": f"{n_cases - len(records)} of {n_cases} cases failed; first: {first}"}
        out, fits, sub = {}, {}, {}
        for phase in ("forward", "backward"):
            coef, quality = fit(records, phase)
            fits[phase] = {"coefficients_us": coef, **quality}
            coef, quality = fit(records, phase, with_submodules=True)
            sub[phase] = {"coefficients_us": coef, **quality}
        for phase in ("forward", "backward"):
            out[f"{phase}_unit_us"] = fits[phase]["coefficients_us"]["unit"]
            out[f"{phase}_tensor_us"] = fits[phase]["coefficients_us"]["tensor"]
        for phase in ("forward", "backward"):
            out[f"{phase}_step_us"] = fits[phase]["coefficients_us"]["step"]
        if flavour == "deepspeed":
            for phase in ("forward", "backward"):
                out[f"{phase}_submodule_us"] = sub[phase]["coefficients_us"]["submodule"]
        out["fit"] = {"model": "extra = step + unit*units + tensor*tensors", **fits}
        out["fit_with_submodules"] = {
            "model": "extra = step + unit*units + submodule*linear_submodules + tensor*tensors", **sub}
        for stat in ("p10", "thread_cpu_median"):
            alt = {}
            for phase in ("forward", "backward"):
                coef, quality = fit(records, phase, stat=stat)
                alt[phase] = {"coefficients_us": coef, "r2": quality["r2"],
                              "residual_rms_us": quality["residual_rms_us"]}
            out[f"fit_{stat}"] = alt
        out["config"] = records[-1]["info"]
        return out

    summary = entry(by_variant.get("main", []), [e for e in errors if e["variant"] == "main"])
    if flavour == "deepspeed":
        summary["deepspeed_config"] = DS_CONFIG
        other = [e for e in errors if e["variant"] == "default_persistence"]
        summary["default_persistence"] = {
            **entry(by_variant.get("default_persistence", []), other, DEFAULT_PERSISTENCE_GRID),
            "grid": {k: list(v) for k, v in DEFAULT_PERSISTENCE_GRID.items()},
            "deepspeed_config": DS_CONFIG_DEFAULT_PERSISTENCE}
    if flavour == "deepspeed_zero12":
        summary["deepspeed_config"] = DS_CONFIG_ZERO2
        other = [e for e in errors if e["variant"] == "stage1"]
        summary["stage1"] = {**entry(by_variant.get("stage1", []), other),
                             "deepspeed_config": DS_CONFIG_ZERO1}
    if errors:
        summary["case_errors"] = errors
    samples = []
    for r in result["records"]:
        name = flavour if r["variant"] == "main" else f"{flavour}/{r['variant']}"
        samples.append({"flavour": name, "units": r["units"], "linears_per_unit": r["linears_per_unit"],
                        "bias": r["bias"], "submodules": r["submodules"], "tensors": r["tensors"],
                        "bare_forward_us": r["bare_us"]["forward"],
                        "bare_backward_us": r["bare_us"]["backward"],
                        "forward_us": r["wrapped_us"]["forward"],
                        "backward_us": r["wrapped_us"]["backward"],
                        "pass_medians_bare_wrapped_us": r["pass_medians"]})
    return summary, samples


# ----------------------------------------------------------------------------------------------
# Part 3: the host optimizers


def make_host_optimizer(name, params):
    import torch

    if name == "deepspeed_cpu_adam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=1e-3, weight_decay=0.01, adamw_mode=True)
    kwargs = {"torch_adamw_foreach_false": {"foreach": False},
              "torch_adamw_foreach_true": {"foreach": True},
              "torch_adamw_fused": {"fused": True}}[name]
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, **kwargs)


def measure_optimizer(name):
    """One pass of one optimizer's step on N float32 CPU parameters with all threads."""
    import torch

    torch.set_num_threads(os.cpu_count())
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(OPT_TENSOR_NUMEL, generator=g)) for _ in range(OPT_TENSORS)]
    for p in params:
        p.grad = torch.randn(OPT_TENSOR_NUMEL, generator=g) * 1e-3
    optimizer = make_host_optimizer(name, params)
    times = []
    for i in range(OPT_WARMUP + OPT_MEASURED):
        t0 = time.perf_counter()
        optimizer.step()
        t = time.perf_counter() - t0
        if i >= OPT_WARMUP:
            times.append(t)
    out = {"threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
           "step_s": times}
    if name == "torch_adamw_foreach_false":
        # What torch.optim.AdamW picks when given neither foreach nor fused, on these CPU tensors.
        from torch.optim.optimizer import _default_to_fused_or_foreach

        default = torch.optim.AdamW(params)
        fused, foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
        out["torch_adamw_default"] = {
            "constructor_defaults": {"foreach": default.defaults.get("foreach"),
                                     "fused": default.defaults.get("fused")},
            "picks_on_cpu_tensors": {"foreach": bool(foreach), "fused": bool(fused)},
            "measured_as": "torch_adamw_foreach_true" if foreach else "torch_adamw_foreach_false",
        }
    return out


def summarise_optimizer(passes):
    """The optimizer's entry from its passes (the quietest pass's median)."""
    medians = [statistics.median(p["step_s"]) for p in passes]
    k = medians.index(min(medians))
    n = OPT_TENSORS * OPT_TENSOR_NUMEL
    return {"Gparams_per_s": round(n / medians[k] / 1e9, 4), "threads": passes[k]["threads"],
            "params": n, "tensors": OPT_TENSORS, "omp_num_threads": passes[k]["omp_num_threads"],
            "step_s_median": round(medians[k], 5),
            "pass_step_s": [[round(t, 5) for t in p["step_s"]] for p in passes]}


# ----------------------------------------------------------------------------------------------
# Launcher


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loadavg():
    """The 1, 5 and 15 minute load averages (/proc/loadavg), or None."""
    try:
        with open("/proc/loadavg") as f:
            return [float(v) for v in f.read().split()[:3]]
    except (OSError, ValueError):
        return None


def run_part(part, tmpdir, label):
    """Runs one part in its own process; returns (result dict or None, error line or None, loads)."""
    out = os.path.join(tmpdir, f"{label}.json")
    threads = str(os.cpu_count()) if part in HOST_OPTIMIZERS else "1"
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS=threads, MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
               PYTHONWARNINGS="ignore")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", part, "--worker-out", out]
    log = os.path.join(tmpdir, f"{label}.log")
    started, load_before = time.time(), loadavg()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                timeout=PART_TIMEOUT_S).returncode
        except subprocess.TimeoutExpired:
            rc = f"timeout after {PART_TIMEOUT_S} s"
    loads = {"before": load_before, "after": loadavg(), "seconds": round(time.time() - started)}
    print(f"{label}: {loads['seconds']} s, load {load_before} -> {loads['after']}", flush=True)
    if rc == 0 and os.path.exists(out):
        with open(out) as f:
            return json.load(f), None, loads
    with open(log) as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
    print("\n".join(lines[-30:]))
    return None, f"exit {rc}: " + (lines[-1] if lines else "no output"), loads


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def package_version(name):
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def command_line(args):
    """The command as the file records it: repository-relative, no machine paths."""
    out = os.path.relpath(args.update or args.out)
    if out.startswith(".."):
        out = os.path.basename(out)
    if args.update:
        parts = [GENERATED_BY]
        for name in args.only:
            parts += ["--only", name]
        parts += ["--update", out] + (["--replace"] if args.replace else [])
        return " ".join(parts)
    parts = [GENERATED_BY, "--out", out]
    for name in args.only or []:
        parts += ["--only", name]
    return " ".join(parts)


def method_record():
    return {
        "width": WIDTH, "input": [1, WIDTH], "dtype": "float32", "world_size": 1,
        "backend": "gloo", "timer": "time.perf_counter", "passes": PASSES,
        "warmup_rounds_first_pass": WARMUP, "warmup_rounds_later_passes": REWARM,
        "measured_rounds_per_pass": MEASURED, "op_batch": OP_BATCH, "units": list(UNITS),
        "linears_per_unit": list(LINEARS_PER_UNIT), "bias": list(BIASES),
        "statistic": "median of the pass with the smallest (wrapped) median",
        "extra": "wrapped median - bare median (same rounds) per model and phase, fitted over the grid",
        "optimizer_params": OPT_TENSORS * OPT_TENSOR_NUMEL, "optimizer_tensors": OPT_TENSORS,
        "optimizer_warmup_steps": OPT_WARMUP, "optimizer_measured_steps_per_pass": OPT_MEASURED,
    }


def update_file(args):
    """--update: measures only the flavours named by --only and merges each, with its own record
    (command, versions, host, method, samples), into doc["flavours"] of an existing file; every
    other key of the file is written back with the value it had. A flavour the file already has is
    refused unless --replace is given."""
    with open(args.update) as f:
        doc = json.load(f)
    flavours = doc.setdefault("flavours", {})
    for name in args.only:
        if name not in FLAVOURS:
            raise SystemExit(f"--update takes flavours only ({', '.join(FLAVOURS)}), not {name}")
        if name in flavours and not args.replace:
            raise SystemExit(f"{args.update} already has flavours.{name}; give --replace to measure it again")
    started, failures = time.time(), {}
    with tempfile.TemporaryDirectory() as tmpdir:
        for name in args.only:
            result, err, loads = run_part(name, tmpdir, name)
            if err:
                failures[name] = err
                continue
            entry, samples = summarise_flavour(name, result)
            entry["command"] = command_line(args)
            entry["versions"] = {"python": platform.python_version(), "torch": package_version("torch"),
                                 "deepspeed": package_version("deepspeed"),
                                 "numpy": package_version("numpy")}
            entry["host"] = {"cpu": cpu_model(), "threads": 1, "cpu_count": os.cpu_count(),
                             "loadavg": loads}
            entry["method"] = {k: v for k, v in method_record().items() if not k.startswith("optimizer_")
                               and k != "op_batch"}
            entry["samples"] = samples
            entry["elapsed_s"] = loads["seconds"]
            flavours[name] = entry
    if failures:
        for k, v in sorted(failures.items()):
            print(f"FAILED {k}: {v}")
        print(f"{args.update} left as it was")
        return 1
    with open(args.update, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"merged {', '.join(args.only)} into {args.update} in {time.time() - started:.0f} s")
    return 0


def worker(part, out):
    if part == "dispatch":
        result = measure_dispatch()
    elif part in HOST_OPTIMIZERS:
        result = measure_optimizer(part)
    else:
        result = measure_flavour(part)
    with open(out, "w") as f:
        json.dump(result, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/costmodel/data/oracle_overheads.json")
    ap.add_argument("--only", action="append", choices=PARTS, help="run only these parts (repeatable)")
    ap.add_argument("--update", metavar="FILE",
                    help="measure only the flavours given by --only and merge them into FILE's "
                         "flavours, leaving the rest of FILE as it is")
    ap.add_argument("--replace", action="store_true",
                    help="with --update: measure again a flavour FILE already has")
    ap.add_argument("--worker", choices=PARTS, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.worker_out)
        return 0
    if args.update:
        if not args.only:
            ap.error("--update needs --only FLAVOUR")
        return update_file(args)

    started = time.time()
    wanted = [p for p in PARTS if not args.only or p in args.only]
    results, failures, loads = {}, {}, {}
    repeated = {name: [] for name in REPEATED if name in wanted}
    with tempfile.TemporaryDirectory() as tmpdir:
        for part in wanted:
            if part in REPEATED:
                continue
            results[part], err, loads[part] = run_part(part, tmpdir, part)
            if err:
                failures[part] = err
        for p in range(PASSES):  # op dispatch's and the optimizers' passes, interleaved
            for name in repeated:
                if name in failures:
                    continue
                label = f"{name}#{p}"
                result, err, loads[label] = run_part(name, tmpdir, label)
                if err:
                    failures[name] = err
                else:
                    repeated[name].append(result)

    dispatch = (repeated.get("dispatch") or [{}])[0]
    doc = {
        "schema_version": SCHEMA_VERSION,
        "generated_by": GENERATED_BY,
        "command": command_line(args),
        "versions": {"python": platform.python_version(),
                     "torch": dispatch.get("torch") or package_version("torch"),
                     "deepspeed": package_version("deepspeed"),
                     "numpy": package_version("numpy")},
        "host": {"cpu": cpu_model(), "threads": dispatch.get("threads"), "cpu_count": os.cpu_count(),
                 "loadavg_by_part": loads},
        "method": method_record(),
    }
    if "dispatch" in failures:
        doc["op_dispatch_us"] = {"error": failures["dispatch"]}
    elif dispatch:
        by_mode, dispatch_record = summarise_dispatch(repeated["dispatch"])
        doc["op_dispatch_us"] = round(statistics.median(by_mode["no_grad"].values()), 3)
        doc["op_dispatch_by_op_us"] = by_mode["no_grad"]
        doc["op_dispatch_autograd_us"] = round(statistics.median(by_mode["autograd"].values()), 3)
        doc["op_dispatch_autograd_by_op_us"] = by_mode["autograd"]
    flavours, samples = {}, []
    for flavour in FLAVOURS:
        if flavour in failures:
            flavours[flavour] = {"error": failures[flavour]}
        elif results.get(flavour):
            flavours[flavour], s = summarise_flavour(flavour, results[flavour])
            samples += s
    doc["flavours"] = flavours
    host_optimizer = {}
    for name, passes in repeated.items():
        if name == "dispatch":
            continue
        if name in failures:
            host_optimizer[name] = {"error": failures[name]}
        elif passes:
            host_optimizer[name] = summarise_optimizer(passes)
            if "torch_adamw_default" in passes[0]:
                host_optimizer["torch_adamw_default"] = passes[0]["torch_adamw_default"]
    doc["host_optimizer"] = host_optimizer
    if dispatch:
        doc["samples_op_dispatch"] = dispatch_record
    doc["samples"] = samples
    doc["elapsed_s"] = round(time.time() - started)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{len(samples)} samples, {len(failures)} failed parts in {time.time() - started:.0f} s -> {args.out}")
    for k, v in sorted(failures.items()):
        print(f"FAILED {k}: {v}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
