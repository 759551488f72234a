#!/usr/bin/env python3
"""Measure whole training steps under accelerate's own FSDP preparation (FSDP1 and FSDP2).

What it measures
    One training step of the Hugging Face models of measure_steps.py (``LlamaForCausalLM`` and
    ``GPT2LMHeadModel`` with 256-wide hidden states, float32 parameters, dropout 0, the model's own
    loss, ``torch.optim.AdamW(foreach=True)``), the second of two, on 2 gloo CPU ranks, prepared by
    accelerate 1.16.0 itself as transformers' Trainer has it prepare them:

        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=1 | 2, auto_wrap_policy="transformer_based_wrap",
            transformer_cls_names_to_wrap=[the decoder layer's class],
            activation_checkpointing=True | False,
            use_orig_params=True)          # FSDP1 only, as the Trainer passes it
        accelerator = Accelerator(mixed_precision="bf16" | "no", fsdp_plugin=plugin, cpu=True)
        model, optimizer = accelerator.prepare(model, optimizer)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        accelerator.backward(loss); optimizer.step(); optimizer.zero_grad(set_to_none=True)

    accelerate's defaults otherwise (FSDP1: FULL_SHARD, backward_prefetch None, limit_all_gathers;
    FSDP2: reshard_after_forward True; set_mixed_precision's policy; its own units, its own
    activation checkpointing, its autocast where it applies one). The grid: the two models x
    sequence 128 x micro-batch 1/2 x activation checkpointing none/full x fsdp_version 1/2 x
    mixed_precision "bf16"/"no".

The one override
    accelerate does not run its FSDP integration on CPU ranks: ``Accelerator(cpu=True)`` makes
    ``AcceleratorState`` MULTI_CPU, and only its branch for the GPU-type distributed types
    (state.py l.947-976) sets ``distributed_type = FSDP``, calls ``fsdp_plugin.set_mixed_precision``
    and stores the plugin; ``prepare()`` would then wrap the model in DDP.
    ``force_fsdp_on_cpu_ranks`` does those three things itself after ``Accelerator(...)`` (and,
    for FSDP1, gives accelerate's ``device_id=self.device`` the plain CPU device); everything from
    ``prepare()`` on is accelerate's code. The corpus header's ``override`` field says so.

How it measures
    As validation/measure_fsdp1_steps.py does: measure_steps.py's ``MemTracker`` probe (each
    category's own peak, where the total peaked; FSDP1 tracked without gradient hooks), for FSDP2
    its ``FSDPMemTracker`` probe with fsdp2_on_gloo.FSDPPostBackwardProbe, and gloo's
    reduce-scatter copies filed apart (fsdp2_on_gloo.gloo_copies_counted); two repeats per case and
    rank. The trackers follow the optimizer accelerate wraps (``AcceleratedOptimizer.optimizer``).

    FSDP2's tracker also keeps the hooks of accelerate's multi-module group as FSDP2 has them
    (fsdp2_on_gloo.FSDPGroupHooksProbe). ``fsdp2_prepare_model`` shards the final norm and the
    head together, ``fully_shard([model.norm, lm_head])`` for Llama and
    ``fully_shard([ln_f, wte, lm_head])`` for GPT-2 (its tied embedding), one FSDPState whose
    forward hooks ``_register_group_forward_hooks`` (torch/distributed/fsdp/_fully_shard/
    _fsdp_state.py) registers so that the full ``_post_forward`` runs once, after the group's
    last module. ``FSDPMemTracker._instrument_fsdp_module`` (torch 2.15,
    torch/distributed/_tools/fsdp2_mem_tracker.py) replaces that handle with ``_pre_forward`` and
    ``_post_forward`` on each module, so in the tracked step's backward the group is unsharded,
    reduce-scattered and resharded once per module, on hooks an untracked step does not have:
    Llama's fp32 micro-batch-1 step measured 54,859,048 B where torch.profiler's untracked step
    holds 53,614,888 B, GPT-2's fp32 micro-batch-1 step 56,382,172 B where it holds 60,579,548 B.
    The
    probe registers the tracker's wrappers through ``_register_group_forward_hooks`` with the
    state's own ``_modules_to_run_forward`` and ``_cast_output_dtype``, wraps the group's
    ``pre_backward``/``post_backward`` once, and restores the grouped hooks on exit; groups of
    one module (each decoder layer, the root) are instrumented by FSDPMemTracker's own code as
    before. FSDP1 is tracked by MemTracker, which has no such hooks.

    Each case also records what accelerate set, read back from the prepared model in the warm-up
    step (``accelerate``): whether the forward ran under autocast, the logits' dtype, the FSDP
    units (their modules and parameter counts; per FSDP1 unit its MixedPrecision, sharding
    strategy, backward prefetch, use_orig_params; per FSDP2 unit its MixedPrecisionPolicy and
    reshard_after_forward), and the modules accelerate's activation checkpointing wrapped.

Output
    A JSON corpus (``--out``) in measure_steps.py's format; ``wrapper`` is "fsdp1" or "fsdp2", the
    wrappers tests/planner/oracle_step_rows.cpp knows, ``framework`` "accelerate", with
    ``fsdp_mixed_precision`` (Composer's name for the MixedPrecision accelerate set: "pure" under
    bf16, null without mixed precision), ``fsdp_reduce_dtype`` and ``planner_args``, the planner
    flags the case corresponds to (``planner estimate --strategy fsdp-full --flavour fsdp1|fsdp2
    --recipe hf ...``; oracle_step_rows.cpp's fsdp2 branch passes --reduce-dtype=fp32, which is
    not what accelerate's bf16 cases ran).

    In a venv of its own (validation/regenerate.sh makes it):
    python3 -m venv validation/.venv-accelerate &&
    validation/.venv-accelerate/bin/pip install -r validation/requirements-accelerate.txt &&
    validation/.venv-accelerate/bin/python validation/measure_accelerate_steps.py \
        --out tests/costmodel/data/oracle_accelerate_steps.json
"""

import argparse
import gc
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure_steps as steps  # noqa: E402
from fsdp2_on_gloo import (FSDPGroupHooksProbe, FSDPPostBackwardProbe,  # noqa: E402
                           gloo_copies_counted)

GENERATED_BY = "validation/measure_accelerate_steps.py"
CONFIGS = ("llama-h256", "gpt2-h256")
SEQ_LENS = (128,)
MICRO_BATCHES = (1, 2)
CHECKPOINTING = ("none", "full")
FSDP_VERSIONS = (1, 2)
# accelerate's mixed_precision -> the corpus's precision
MIXED_PRECISIONS = (("bf16", "bf16-mixed"), ("no", "fp32"))
WORLD_SIZE = 2
REPEATS = 2  # gloo's threads release buffers when they get to it: each case twice per rank

OVERRIDE = (
    "accelerate 1.16.0 builds MULTI_CPU for Accelerator(cpu=True) and never picks FSDP there: "
    "AcceleratorState.__init__ (accelerate/state.py l.947-976) sets distributed_type = FSDP, calls "
    "fsdp_plugin.set_mixed_precision(mixed_precision) and stores the plugin only for the GPU-type "
    "distributed types. force_fsdp_on_cpu_ranks does exactly those three things on the shared "
    "PartialState/AcceleratorState after Accelerator(...), and for FSDP1 sets the state's device "
    "to torch.device('cpu') (accelerate passes device_id=self.device to FullyShardedDataParallel, "
    "which refuses MULTI_CPU's cpu:0 beside parameters on cpu); "
    "Accelerator.prepare, accelerator.backward and the AcceleratedOptimizer are accelerate's own.")


def case_grid():
    for config in CONFIGS:
        for version in FSDP_VERSIONS:
            for mixed_precision, precision in MIXED_PRECISIONS:
                for checkpointing in CHECKPOINTING:
                    for seq_len in SEQ_LENS:
                        for micro_batch in MICRO_BATCHES:
                            yield {"config": config, "fsdp_version": version,
                                   "mixed_precision": mixed_precision, "precision": precision,
                                   "checkpointing": checkpointing, "seq_len": seq_len,
                                   "micro_batch": micro_batch}


def case_id(case):
    return (f"accelerate-fsdp{case['fsdp_version']}/{case['config']}/{case['precision']}/"
            f"{case['checkpointing']}/s{case['seq_len']}-b{case['micro_batch']}/w{WORLD_SIZE}")


# ----------------------------------------------------------------------------------------------
# accelerate


def force_fsdp_on_cpu_ranks(accelerator, plugin):
    """Makes accelerate's shared state what AcceleratorState.__init__ makes it on GPU ranks.

    accelerate 1.16.0, accelerate/state.py l.947-976: for MULTI_GPU and the other GPU-type
    distributed types (not MULTI_CPU) with an fsdp_plugin, ``AcceleratorState.__init__`` runs

        self.distributed_type = DistributedType.FSDP
        if self._mixed_precision != "no" and fsdp_plugin is not None:
            fsdp_plugin.set_mixed_precision(self._mixed_precision)
        self.fsdp_plugin = fsdp_plugin

    This does the same on the shared states (PartialState's and AcceleratorState's, which the
    Accelerator reads) after ``Accelerator(cpu=True, ...)`` has made them MULTI_CPU. For FSDP1 it
    also sets the state's device to ``torch.device("cpu")``: ``Accelerator.prepare_model`` passes
    ``device_id=self.device`` to ``FullyShardedDataParallel``, where a GPU rank has its CUDA device;
    a MULTI_CPU state's device is ``cpu:0``, which FSDP1 refuses beside the parameters' ``cpu``
    ("Inconsistent compute device and `device_id`").
    Nothing else is changed; ``accelerator.prepare`` then wraps the model with accelerate's code.
    """
    import torch
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    for shared in (PartialState._shared_state, AcceleratorState._shared_state):
        shared["distributed_type"] = DistributedType.FSDP
        if plugin.fsdp_version == 1:
            shared["device"] = torch.device("cpu")
    if accelerator.state._mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.state._mixed_precision)
    accelerator.state.fsdp_plugin = plugin


def make_accelerator(case, model):
    """A fresh Accelerator (accelerate's shared states reset) with the case's FSDP plugin."""
    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    kwargs = {"fsdp_version": case["fsdp_version"], "auto_wrap_policy": "transformer_based_wrap",
              "transformer_cls_names_to_wrap": [type(steps.decoder_layers(model)[0]).__name__],
              "activation_checkpointing": case["checkpointing"] == "full"}
    if case["fsdp_version"] == 1:
        kwargs["use_orig_params"] = True  # transformers' Trainer passes it for FSDP1
    plugin = FullyShardedDataParallelPlugin(**kwargs)
    accelerator = Accelerator(mixed_precision=case["mixed_precision"], fsdp_plugin=plugin,
                              cpu=True)
    force_fsdp_on_cpu_ranks(accelerator, plugin)
    return accelerator, plugin


def train_step(accelerator, model, optimizer, ids):
    """The step as an accelerate script writes it: accelerate's forward, backward, optimizer."""
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


# ----------------------------------------------------------------------------------------------
# What accelerate set


def dtype_name(dtype):
    return None if dtype is None else str(dtype).replace("torch.", "")


def enum_name(value):
    return None if value is None else getattr(value, "name", str(value))


def watch_forward(model):
    """Hooks the first Linear/Conv1D: whether autocast is on there and the dtype it computes in."""
    import torch

    seen = {}
    linear = next(m for m in model.modules()
                  if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D")

    def hook(module, inputs, output):
        seen.setdefault("autocast", torch.is_autocast_enabled("cpu"))
        seen.setdefault("linear_output_dtype", dtype_name(output.dtype))

    handle = linear.register_forward_hook(hook)
    return seen, handle


def module_name(fqn):
    """A module's or parameter's name without FSDP1's and the checkpoint wrapper's own levels."""
    parts = [p for p in fqn.split(".")
             if p not in ("_fsdp_wrapped_module", "_checkpoint_wrapped_module")]
    return ".".join(parts) or "<root>"


def fsdp1_units(model):
    from torch.distributed.fsdp import FullyShardedDataParallel

    units = []
    for name, m in model.named_modules():
        if not isinstance(m, FullyShardedDataParallel):
            continue
        mp = m.mixed_precision
        flat = m._flat_param if m._has_params else None
        units.append({
            "modules": [module_name(name)],
            "wraps": type(m._fsdp_wrapped_module).__name__,
            "params": int(sum(flat._numels)) if flat is not None else 0,
            "flat_param_shard": [dtype_name(flat.dtype), int(flat.numel())] if flat is not None
            else None,
            "param_dtype": dtype_name(mp.param_dtype),
            "reduce_dtype": dtype_name(mp.reduce_dtype),
            "buffer_dtype": dtype_name(mp.buffer_dtype),
            "sharding_strategy": enum_name(m.sharding_strategy),
            "backward_prefetch": enum_name(m.backward_prefetch),
            "forward_prefetch": bool(m.forward_prefetch),
            "limit_all_gathers": bool(m.limit_all_gathers),
            "use_orig_params": bool(m._use_orig_params),
        })
    return units


def fsdp2_units(model):
    """One entry per FSDP2 parameter group; a group accelerate made of several modules
    (``fully_shard([final_norm, lm_head])``) is one unit with every module's name."""
    from torch.distributed.fsdp import FSDPModule

    units, by_state = [], {}
    for name, m in model.named_modules():
        if not isinstance(m, FSDPModule):
            continue
        state = m._get_fsdp_state()
        if id(state) in by_state:
            by_state[id(state)]["modules"].append(module_name(name))
            continue
        group = state._fsdp_param_group
        params = group.fsdp_params if group else []
        policies = {str(p.mp_policy) for p in params}
        if len(policies) > 1:
            raise RuntimeError(f"{name}: one FSDP2 group, several policies {sorted(policies)}")
        policy = params[0].mp_policy if params else None
        unit = {
            "modules": [module_name(name)],
            "class": type(m).__name__,
            "params": int(sum(p._orig_size.numel() for p in params)),
            "param_names": [module_name(p._param_fqn) for p in params],
            "param_dtype": dtype_name(policy.param_dtype) if policy else None,
            "reduce_dtype": dtype_name(policy.reduce_dtype) if policy else None,
            "output_dtype": dtype_name(policy.output_dtype) if policy else None,
            "cast_forward_inputs": policy.cast_forward_inputs if policy else None,
            # after the first step: the root's None (PyTorch's heuristic) resolved
            "reshard_after_forward": group.post_forward_mesh_info is not None if group else None,
        }
        by_state[id(state)] = unit
        units.append(unit)
    return units


def composer_mode(units, autocast):
    """Composer's name for the MixedPrecision the units have (measure_fsdp1_steps.py's modes)."""
    dtypes = {(u["param_dtype"], u["reduce_dtype"]) for u in units if u["params"]}
    if dtypes == {("bfloat16", "bfloat16")}:
        return "pure"
    if dtypes == {("bfloat16", "float32")}:
        return "default"
    if dtypes == {(None, None)}:
        return "full" if autocast else None
    return "mixed: " + repr(sorted(dtypes, key=str))


PLUGIN_FIELDS = ("sharding_strategy", "reshard_after_forward", "backward_prefetch",
                 "forward_prefetch", "limit_all_gathers", "use_orig_params", "sync_module_states",
                 "activation_checkpointing")


def plugin_value(value):
    return value if isinstance(value, bool) else enum_name(value)


def accelerate_setup(accelerator, plugin, model, seen, logits_dtype):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    checkpointed = [module_name(n) for n, m in model.named_modules()
                    if isinstance(m, CheckpointWrapper)]
    units = fsdp1_units(model) if plugin.fsdp_version == 1 else fsdp2_units(model)
    return {
        "distributed_type": str(accelerator.distributed_type).split(".")[-1],
        "mixed_precision": accelerator.mixed_precision,
        "native_amp": bool(accelerator.native_amp),
        "forward_autocast": bool(seen.get("autocast")),
        "linear_output_dtype": seen.get("linear_output_dtype"),
        "logits_dtype": logits_dtype,
        "mixed_precision_policy": str(plugin.mixed_precision_policy),
        "plugin": {k: plugin_value(getattr(plugin, k)) for k in PLUGIN_FIELDS},
        "checkpoint_wrapped": checkpointed,
        "units": units,
    }


# ----------------------------------------------------------------------------------------------
# One case, one rank


def planner_args(case, mode, reduce_dtype):
    """The planner flags the case corresponds to (those oracle_step_rows.cpp adds for the shape,
    less --hardware: fsdp1 cases there run on the A100 profile made a CPU rank)."""
    args = ["--strategy=fsdp-full", f"--flavour=fsdp{case['fsdp_version']}", "--recipe=hf",
            f"--precision={case['precision']}", f"--checkpointing={case['checkpointing']}",
            f"--seq-len={case['seq_len']}", f"--micro-batch={case['micro_batch']}",
            f"--global-batch={case['micro_batch'] * WORLD_SIZE}", f"--gpus={WORLD_SIZE}",
            f"--gpus-per-node={WORLD_SIZE}", "--attention=flash", "--loss=upcast",
            "--optimizer=adamw"]
    if mode:
        args.append(f"--fsdp-mixed-precision={mode}")
    if reduce_dtype:
        args.append(f"--reduce-dtype={ {'float32': 'fp32', 'bfloat16': 'bf16'}[reduce_dtype] }")
    return args


def make_tracker(version, model, optimizer, ids):
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    if version == 2:
        class ProbedFSDPMemTracker(steps._PeakProbe, FSDPGroupHooksProbe, FSDPPostBackwardProbe,
                                   FSDPMemTracker):
            pass

        tracker = ProbedFSDPMemTracker(model, optimizer)
        tracker.track_inputs((ids,))
    else:
        class ProbedMemTracker(steps._PeakProbe, MemTracker):
            # As measure_fsdp1_steps.py: FSDP1's views of its flat parameter take no gradient hook.
            def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
                return super()._track_module_params_and_buffers(module, install_grad_hooks=False)

        tracker = ProbedMemTracker()
        tracker.track_external(model, optimizer, ids)
    tracker._probe_init()
    return tracker


def measure_case(rank, case):
    model = steps.build_model(case["config"], "none")  # accelerate's plugin checkpoints
    params = steps.parameter_count(model)
    optimizer = steps.make_optimizer(model)
    accelerator, plugin = make_accelerator(case, model)
    model, optimizer = accelerator.prepare(model, optimizer)
    inner = optimizer.optimizer  # the AdamW inside accelerate's AcceleratedOptimizer
    ids = steps.make_batch(case["config"], case["seq_len"], case["micro_batch"], rank)

    seen, handle = watch_forward(model)
    out = model(input_ids=ids, labels=ids, use_cache=False)  # the warm-up step
    logits_dtype = dtype_name(out.logits.dtype)
    accelerator.backward(out.loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    handle.remove()
    del out
    setup = accelerate_setup(accelerator, plugin, model, seen, logits_dtype)
    gc.collect()

    tracker = make_tracker(case["fsdp_version"], model, inner, ids)
    with tracker, gloo_copies_counted(tracker):
        loss = train_step(accelerator, model, optimizer, ids)
    mode = composer_mode(setup["units"], setup["forward_autocast"])
    reduce_dtype = next((u["reduce_dtype"] for u in setup["units"] if u["params"]), None)
    record = {
        "id": case_id(case),
        "wrapper": f"fsdp{case['fsdp_version']}",
        "framework": "accelerate",
        "world_size": WORLD_SIZE,
        "config": case["config"],
        "model_class": steps.CONFIGS[case["config"]]["architectures"][0],
        "params": params,
        "seq_len": case["seq_len"],
        "micro_batch": case["micro_batch"],
        "precision": case["precision"],
        "accelerate_mixed_precision": case["mixed_precision"],
        "fsdp_mixed_precision": mode,
        "fsdp_reduce_dtype": reduce_dtype,
        "attention": "flash",
        "loss": "upcast",
        "checkpointing": case["checkpointing"],
        "optimizer": "adamw",
        "recipe": "hf",
        "planner_args": planner_args(case, mode, reduce_dtype),
        **steps.read_tracker(tracker, steps.optimizer_state_bytes(inner)),
        "loss_value": round(loss, 4),
        "accelerate": setup,
    }
    del tracker, optimizer, inner, model, accelerator, plugin
    gc.collect()
    return record


def worker_main(out_path):
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    rank = int(os.environ.get("RANK", "0"))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")  # accelerate's PartialState takes it as it is
    records, errors = [], []
    for case in case_grid():
        try:
            samples = [measure_case(rank, case) for _ in range(REPEATS)]
            records.append(dict(samples[0], peak_bytes_samples=[r["peak_bytes"] for r in samples]))
        except Exception as e:  # record it and go on with the other cases
            errors.append({"id": case_id(case),
                           "error": f"{type(e).__name__}: {e}".splitlines()[0][:500]})
            if len(errors) == 1:
                import traceback
                traceback.print_exc()
        torch.distributed.barrier()
    with open(out_path, "w") as f:
        json.dump({"rank": rank, "records": records, "errors": errors}, f)
    torch.distributed.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/costmodel/data/oracle_accelerate_steps.json")
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_out:
        worker_main(args.worker_out.format(rank=os.environ.get("RANK", "0")))
        return 0
    started = time.time()
    with tempfile.TemporaryDirectory() as tmpdir:
        rc, files, log = steps.run_workers(os.path.abspath(__file__), WORLD_SIZE,
                                           os.path.join(tmpdir, "accelerate-w2"))
        if rc != 0 or not all(os.path.exists(p) for p in files):
            with open(log) as f:
                print(f.read()[-4000:])
            return 1
        cases, failures, warnings_ = steps.merge_ranks(files)
    import accelerate

    configs = {name: steps.CONFIGS[name] for name in CONFIGS}
    command = f"python {GENERATED_BY} --out {os.path.relpath(args.out)}"
    package_versions = dict(steps.versions(), accelerate=accelerate.__version__)
    steps.write_corpus(args.out, cases, failures, command, generated_by=GENERATED_BY,
                       package_versions=package_versions, configs=configs)
    with open(args.out) as f:  # the header's record of the one override, after "versions"
        doc = json.load(f)
    doc = {k: v for k, v in doc.items() if k != "cases" and k != "failures"} | {
        "override": OVERRIDE, "cases": doc["cases"], "failures": doc["failures"]}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    return steps.report(args.out, cases, failures, warnings_, started)


if __name__ == "__main__":
    sys.exit(main())
