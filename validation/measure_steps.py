#!/usr/bin/env python3
"""Measure the memory of whole training steps of the real frameworks with PyTorch's own trackers.

What it measures
    One training step of a Hugging Face causal LM (``transformers.LlamaForCausalLM`` and
    ``transformers.GPT2LMHeadModel``, dropout 0) with float32 parameters: forward with the model's
    own loss (labels = input ids), backward, ``optimizer.step()`` and
    ``optimizer.zero_grad(set_to_none=True)``, under ``torch.optim.AdamW(lr=1e-3)``. Each case runs
    two steps and measures the second, when the optimizer states exist. The grid is: two models x
    sequence length 128/256 x micro-batch 1/2 x precision ("fp32", "bf16-mixed") x checkpointing
    ("none", "full": HF's non-reentrant ``gradient_checkpointing_enable``) x wrapper:

    - "none":  the bare model in one process, no process group (the reference);
    - "ddp":   ``torch.nn.parallel.DistributedDataParallel`` on gloo, world sizes 1 and 2, its
               defaults (bucket_cap_mb 25, gradient_as_bucket_view False);
    - "fsdp2": ``torch.distributed.fsdp.fully_shard`` on each decoder layer, then on the root
               model, world size 2 on a CPU device mesh (gloo), reshard_after_forward default.

    "bf16-mixed" is ``torch.autocast("cpu", dtype=torch.bfloat16)`` around forward + loss for
    "none" and "ddp", and ``torch.distributed.fsdp.MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=fp32)`` without autocast for "fsdp2". Attention is HF's "sdpa"; the harness records
    which ``aten`` SDPA kernel actually ran. AdamW runs its foreach implementation (``foreach=True``):
    that is PyTorch's default on the accelerators the planner predicts for, while on CPU tensors
    the default would be the per-tensor loop, whose temporaries differ.

How it measures
    ``torch.distributed._tools.mem_tracker.MemTracker`` (a ``TorchDispatchMode`` that follows
    every tensor storage an op returns, with ``torch.distributed._tools.mod_tracker.ModTracker``
    for the module hierarchy and ``torch.optim.optimizer`` step hooks for the optimizer states)
    for "none" and "ddp", and its subclass
    ``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` for "fsdp2". Model, optimizer
    and the batch are registered before the measured step (``track_external`` /
    ``FSDPMemTracker(model, optimizer)`` + ``track_inputs``). The trackers count storage bytes
    (``numel * element_size``; no allocator rounding on CPU) per category after every op, and
    keep the total's peak with the categories at that moment. A small subclass of each tracker
    (``_PeakProbe``) adds what they do not keep: each category's own maximum over the step, and
    the module (innermost active ``ModTracker`` module, "Global" when none) and phase (forward,
    backward, backward-recompute, optimizer) at the moment the total peaked.

    Two refinements of the trackers' categories, neither changing a total:
    - DDP rebuilds its gradient buckets in the second iteration's forward
      (``DistributedDataParallel._pre_forward`` -> ``Reducer._rebuild_buckets``), so the tracker
      would file them under activations; storages first seen inside ``_pre_forward`` (less its
      buffer broadcast) get their own category, ddp_gradient_buckets.
    - The trackers file everything allocated inside ``optimizer.step()`` as optimizer state. The
      states exist before the measured step and are updated in place, so optimizer_states is
      split into the states' own bytes and optimizer_temp (the foreach intermediates).

    Two corrections for FSDP2 on CPU ranks, so that what is measured is what FSDP2 holds on an
    accelerator with NCCL:
    - FSDPMemTracker's post-backward wrapper (torch 2.15) keeps the group's last unsharded
      gradient alive through FSDP2's reduce-scatter by its loop variable; an untracked run frees
      it at the copy-in. The harness wraps post_backward itself, labelling and snapshotting as
      the tracker does, without the reference (fsdp2_on_gloo.FSDPPostBackwardProbe).
    - gloo's reduce-scatter clones its whole input and keeps the clone until the work is waited
      on; NCCL reduces in place. Storages first seen inside FSDP2's reduce-scatter call are that
      clone (fsdp2_on_gloo.gloo_copies_counted): peak_bytes and at_peak are the peak of the
      total less them, and the record keeps their own largest size, gloo_copies_peak_bytes
      (when gloo lets the clone go varies from run to run, and so would the total's peak).

    Storages created before the measured step and first touched inside it are counted from the
    first op that returns them (the trackers only see op outputs and registered objects).

    Multi-rank runs go through ``torch.distributed.run`` (torchrun) on gloo, one intra-op thread
    per rank; each rank writes its results and the launcher keeps rank 0's, with every rank's
    peak in rank_peak_bytes. Where a peak falls at the end of FSDP2's backward, gloo's threads
    release collective buffers at times that vary from run to run, and so may that peak (by up
    to ~5% here): each FSDP2 case is measured REPEATS times per rank, and peak_bytes_range is
    [min, max] over ranks and repeats (rank 0's first measurement is the record).

Output
    A JSON corpus (``--out``) with the versions, the model configs (HF config.json dicts that the
    planner's parser accepts), and one record per case: peak_bytes (total at the peak), at_peak
    {category: bytes at that moment}, category_peaks {category: its own maximum}, the exact
    parameter count, where the peak happened, and the SDPA kernel that ran. Categories are the
    trackers' reference types, renamed: Parameter -> parameters, Buffer -> buffers, Gradient ->
    gradients, Activation -> activations, Temp -> temp, Optstate/OptState -> optimizer_states
    (+ optimizer_temp, above), Other -> other (the batch, under MemTracker); FSDPMemTracker's
    Sharded/Unsharded Param -> sharded_parameters / unsharded_parameters, Sharded/Unsharded
    Grad -> sharded_gradients / unsharded_gradients, All Gather -> all_gather, Reduce Scatter ->
    reduce_scatter, Inputs -> inputs (the batch).

Usage
    python validation/measure_steps.py --out tests/costmodel/data/oracle_steps.json
    (--planner PATH also checks that the planner parses each config to the same parameter count)
"""

import argparse
import contextlib
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fsdp2_on_gloo import (GLOO_COPY, FSDPPostBackwardProbe, filed_as,  # noqa: E402
                           gloo_copies_counted)

SCHEMA_VERSION = 1
GENERATED_BY = "validation/measure_steps.py"

CONFIGS = {
    "llama-h256": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 704,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 4096,
        "max_position_embeddings": 2048,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-05,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "use_cache": False,
    },
    "gpt2-h256": {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_embd": 256,
        "n_layer": 4,
        "n_head": 8,
        "n_positions": 1024,
        "vocab_size": 4096,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-05,
        "attn_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "resid_pdrop": 0.0,
        "tie_word_embeddings": True,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "use_cache": False,
    },
}
# The stress grid's models (--grid stress): multi-query attention with a small vocabulary, exact
# GELU, and a sliding window shorter than the sequence.
STRESS_CONFIGS = {
    "llama-h256-mqa-v512": dict(CONFIGS["llama-h256"], num_key_value_heads=1, vocab_size=512),
    "gpt2-h256-gelu": dict(CONFIGS["gpt2-h256"], activation_function="gelu"),
    "mistral-h256-sw256": dict(
        CONFIGS["llama-h256"], architectures=["MistralForCausalLM"], model_type="mistral",
        sliding_window=256),
}
for _name, _config in STRESS_CONFIGS.items():
    if _config["model_type"] == "mistral":
        for _key in ("attention_bias", "mlp_bias"):  # MistralConfig has neither
            _config.pop(_key)
CONFIGS.update(STRESS_CONFIGS)

# The grids (--grid): "base", the two small models over short sequences, whose peaks fall in the
# optimizer step or the loss's backward; "stress", sequences of 1024 under bf16 autocast, with and
# without checkpointing, where the backward holds the peak, over the models above.
GRIDS = {
    "base": {"configs": ("llama-h256", "gpt2-h256"), "precisions": ("fp32", "bf16-mixed"),
             "checkpointing": ("none", "full"), "seq_lens": (128, 256), "micro_batches": (1, 2)},
    "stress": {"configs": ("llama-h256", "llama-h256-mqa-v512", "gpt2-h256-gelu",
                           "mistral-h256-sw256"),
               "precisions": ("bf16-mixed",), "checkpointing": ("none", "full"),
               "seq_lens": (1024,), "micro_batches": (1, 2)},
}
# The base grid's shapes, shared with measure_deepspeed.py.
SEQ_LENS = GRIDS["base"]["seq_lens"]
MICRO_BATCHES = GRIDS["base"]["micro_batches"]
# (wrapper, world size), in the order of the corpus.
RUNS = (("none", 1), ("ddp", 1), ("ddp", 2), ("fsdp2", 2))
WARMUP_STEPS = 1  # steps before the measured one
# Measurements per case and rank: FSDP2's peaks at the end of the backward vary from run to run
# (gloo's threads release collective buffers when they get to it), so it measures each case
# more than once; the corpus records the range.
REPEATS = {"none": 1, "ddp": 1, "fsdp2": 3}
RANK_TOLERANCE = 0.03  # the peaks of one case (ranks, repeats) may differ by this fraction

CATEGORY_NAMES = {
    "Parameter": "parameters",
    "Buffer": "buffers",
    "Gradient": "gradients",
    "Activation": "activations",
    "Temp": "temp",
    "Optstate": "optimizer_states",
    "OptState": "optimizer_states",
    "Other": "other",
    "Sharded Param": "sharded_parameters",
    "Unsharded Param": "unsharded_parameters",
    "Sharded Grad": "sharded_gradients",
    "Unsharded Grad": "unsharded_gradients",
    "All Gather": "all_gather",
    "Reduce Scatter": "reduce_scatter",
    "Inputs": "inputs",
    "DDP Gradient Buckets": "ddp_gradient_buckets",
}
# The order of the categories in each record.
CATEGORY_ORDER = ("parameters", "sharded_parameters", "unsharded_parameters", "buffers",
                  "gradients", "sharded_gradients", "unsharded_gradients", "ddp_gradient_buckets",
                  "activations", "temp", "all_gather", "reduce_scatter", "optimizer_states",
                  "optimizer_temp", "other", "inputs")


# ----------------------------------------------------------------------------------------------
# The grid


def case_grid(grid="base"):
    """Every (config, seq_len, micro_batch, precision, checkpointing) of a grid, in corpus order."""
    g = GRIDS[grid]
    for config in g["configs"]:
        for precision in g["precisions"]:
            for checkpointing in g["checkpointing"]:
                for seq_len in g["seq_lens"]:
                    for micro_batch in g["micro_batches"]:
                        yield {
                            "config": config,
                            "seq_len": seq_len,
                            "micro_batch": micro_batch,
                            "precision": precision,
                            "checkpointing": checkpointing,
                        }


def case_id(wrapper, world_size, case):
    return (f"{wrapper}/{case['config']}/{case['precision']}/{case['checkpointing']}/"
            f"s{case['seq_len']}-b{case['micro_batch']}/w{world_size}")


# ----------------------------------------------------------------------------------------------
# Model, batch, wrapper, optimizer, step


def build_model(config_name, checkpointing):
    """The HF model from CONFIGS with float32 parameters, seed-0 init, sdpa attention, train mode."""
    import torch
    import transformers

    cfg = dict(CONFIGS[config_name])
    arch = cfg.pop("architectures")[0]
    config_class = {"LlamaForCausalLM": transformers.LlamaConfig,
                    "MistralForCausalLM": transformers.MistralConfig,
                    "GPT2LMHeadModel": transformers.GPT2Config}[arch]
    cfg.pop("model_type")
    config = config_class(**cfg)
    torch.manual_seed(0)
    model = getattr(transformers, arch)._from_config(
        config, attn_implementation="sdpa", dtype=torch.float32)
    if checkpointing == "full":
        with warnings.catch_warnings():  # transformers 5 calls it a deprecated alias
            warnings.simplefilter("ignore", FutureWarning)
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def parameter_count(model):
    """Distinct parameters (tied embeddings once), as model.parameters() yields them."""
    return sum(p.numel() for p in model.parameters())


def make_batch(config_name, seq_len, micro_batch, rank):
    """Random token ids [micro_batch, seq_len]; the labels are the same tensor."""
    import torch

    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randint(0, CONFIGS[config_name]["vocab_size"], (micro_batch, seq_len), generator=g)


def decoder_layers(model):
    base = getattr(model, model.base_model_prefix)
    return base.layers if hasattr(base, "layers") else base.h


def wrap_model(model, wrapper, precision):
    """DDP with its defaults, or fully_shard per decoder layer and then the root."""
    import torch

    if wrapper == "none":
        return model
    if wrapper == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if wrapper == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
        kwargs = {"mesh": mesh}
        if precision == "bf16-mixed":
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                       reduce_dtype=torch.float32)
        for layer in decoder_layers(model):
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
        return model
    raise ValueError(wrapper)


def make_optimizer(model):
    import torch

    return torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)


def train_step(model, optimizer, ids, precision, wrapper):
    """Forward with the model's loss, backward, optimizer step, zero_grad(set_to_none=True)."""
    import torch

    autocast = (torch.autocast("cpu", dtype=torch.bfloat16)
                if precision == "bf16-mixed" and wrapper != "fsdp2" else contextlib.nullcontext())
    with autocast:
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


# ----------------------------------------------------------------------------------------------
# Trackers


class _PeakProbe:
    """Mixin over MemTracker / FSDPMemTracker: each category's own peak, and where the total peaked.

    The trackers update their peak after every op (``_update_peak_stats``); this hooks the same
    point, so the category peaks are sampled exactly where the total is. The peak it keeps is
    that of the total less gloo's reduce-scatter copies (GLOO_COPY, see gloo_copies_counted);
    without FSDP2 there are none, and it is the trackers' own peak.
    """

    def _probe_init(self):
        self._override_reftype = None  # set by classify_ddp_buckets and gloo_copies_counted
        self.category_peaks = {}
        self.peak_where = ("", "")
        self.sdpa_kernels = set()
        self.held_peak = {}  # device -> (total less gloo's copies, the categories then)

    def _phase(self):
        if self._in_opt:
            return "optimizer"
        if self._mod_tracker.is_bw:
            return "backward-recompute" if self._in_ac else "backward"
        return "forward"

    def _update_peak_stats(self, peak_state):
        super()._update_peak_stats(peak_state)
        for dev, snap in self._curr_mem_snap.items():
            peaks = self.category_peaks.setdefault(dev, {})
            for k, v in snap.items():
                if v > peaks.get(k, 0):
                    peaks[k] = v
            held = snap["Total"] - snap.get(GLOO_COPY, 0)
            if held > self.held_peak.get(dev, (-1, None))[0]:
                self.held_peak[dev] = (held, dict(snap))
                self.peak_where = (deepest_module(self._mod_tracker.parents), self._phase())

    def _track(self, reftype, t):
        super()._track(self._override_reftype or reftype, t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "scaled_dot_product" in func.__name__:
            self.sdpa_kernels.add(func.__name__.split(".")[0])
        return super().__torch_dispatch__(func, types, args, kwargs)


def deepest_module(parents):
    """The innermost active module's FQN (ties: the first in name order); "Global" (ModTracker's
    name for outside every module) when none is active."""
    names = sorted(p for p in parents if p != "Global")
    if not names:
        return "Global"
    return max(names, key=lambda n: n.count("."))


def classify_ddp_buckets(tracker, ddp_model):
    """Gives DDP's gradient buckets their own category for the measured step.

    In the second iteration DDP's ``_pre_forward`` rebuilds the reducer's buckets in the order the
    gradients became ready (``Reducer::rebuild_buckets``); the tracker would file them under
    activations, being created in a forward. While ``_pre_forward`` runs (less its buffer
    broadcast, ``_sync_buffers``), every storage the tracker first sees goes to "DDP Gradient
    Buckets" instead (totals do not change).
    """
    from torch.distributed._tools.mem_tracker import _RefType

    class _DDPRefType(_RefType):
        BUCKETS = "DDP Gradient Buckets"

    original_pre_forward = ddp_model._pre_forward
    original_sync_buffers = ddp_model._sync_buffers

    def pre_forward(*args, **kwargs):
        with filed_as(tracker, _DDPRefType.BUCKETS):
            return original_pre_forward(*args, **kwargs)

    def sync_buffers(*args, **kwargs):
        with filed_as(tracker, None):
            return original_sync_buffers(*args, **kwargs)

    ddp_model._pre_forward = pre_forward
    ddp_model._sync_buffers = sync_buffers


def make_tracker(wrapper, model, optimizer, ids):
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    if wrapper == "fsdp2":
        class ProbedFSDPMemTracker(_PeakProbe, FSDPPostBackwardProbe, FSDPMemTracker):
            pass

        tracker = ProbedFSDPMemTracker(model, optimizer)
        tracker.track_inputs((ids,))
    else:
        class ProbedMemTracker(_PeakProbe, MemTracker):
            pass

        tracker = ProbedMemTracker()
        tracker.track_external(model, optimizer, ids)
        if wrapper == "ddp":
            classify_ddp_buckets(tracker, model)
    tracker._probe_init()
    return tracker


def category_dict(snap):
    """{reference type: bytes} -> {our name: int}, in the tracker's enum order, without 'Total'."""
    out = {}
    for k, v in snap.items():
        name = getattr(k, "value", k)
        if name == "Total":
            continue
        out[CATEGORY_NAMES.get(name, name)] = int(v)
    return out


def optimizer_state_bytes(optimizer):
    """Bytes of the storages behind optimizer.state (exp_avg, exp_avg_sq, step), each once."""
    from torch.distributed._tools.common_utils import get_untyped_storages

    storages = {}
    for state in optimizer.state.values():
        for v in state.values():
            if hasattr(v, "untyped_storage"):
                for st in get_untyped_storages(v):
                    storages[id(st)] = st.nbytes()
    return sum(storages.values())


def split_optimizer(categories, state_bytes):
    """The trackers count everything the optimizer step allocates as optimizer state. In the
    measured step the states already exist and are updated in place, so the category is exactly
    the states plus the step's live temporaries (foreach intermediates): split them."""
    out = dict(categories)
    if "optimizer_states" in out:
        total = out["optimizer_states"]
        out["optimizer_states"] = min(total, state_bytes)
        out["optimizer_temp"] = total - out["optimizer_states"]
    return out


def in_category_order(categories, keys, order=CATEGORY_ORDER):
    """Every key of `keys` (0 where absent), in `order`, then the others sorted."""
    unknown = sorted(set(keys) - set(order))
    return {k: int(categories.get(k, 0)) for k in list(order) + unknown if k in keys}


def read_tracker(tracker, state_bytes):
    """peak_bytes, at_peak, category_peaks, peak_module, peak_phase from the one CPU device."""
    if len(tracker.held_peak) != 1:
        raise RuntimeError(f"expected one device, the tracker saw {list(tracker.held_peak)}")
    (dev, (held, snap)), = tracker.held_peak.items()
    at_peak = split_optimizer(category_dict(snap), state_bytes)
    own_peaks = split_optimizer(category_dict(tracker.category_peaks[dev]), state_bytes)
    for categories in (at_peak, own_peaks):
        categories.pop(GLOO_COPY, None)
    keys = set(at_peak) | set(own_peaks)
    gloo_copies = tracker.category_peaks[dev].get(GLOO_COPY, 0)
    gloo = {"gloo_copies_peak_bytes": int(gloo_copies)} if gloo_copies > 0 else {}
    return {
        "peak_bytes": int(held),
        **gloo,
        "at_peak": in_category_order(at_peak, keys),
        "category_peaks": in_category_order(own_peaks, keys),
        "peak_module": tracker.peak_where[0],
        "peak_phase": tracker.peak_where[1],
        "sdpa_kernel": ",".join(sorted(tracker.sdpa_kernels)),
    }


# ----------------------------------------------------------------------------------------------
# One case, one rank


def measure_case(wrapper, world_size, rank, case):
    """Build, warm up, then track one step; returns this rank's record."""
    model = build_model(case["config"], case["checkpointing"])
    params = parameter_count(model)
    model = wrap_model(model, wrapper, case["precision"])
    optimizer = make_optimizer(model)
    ids = make_batch(case["config"], case["seq_len"], case["micro_batch"], rank)
    for _ in range(WARMUP_STEPS):
        train_step(model, optimizer, ids, case["precision"], wrapper)
    gc.collect()
    tracker = make_tracker(wrapper, model, optimizer, ids)
    gloo = gloo_copies_counted(tracker) if wrapper == "fsdp2" else contextlib.nullcontext()
    with tracker, gloo:
        loss = train_step(model, optimizer, ids, case["precision"], wrapper)
    record = {
        "id": case_id(wrapper, world_size, case),
        "wrapper": wrapper,
        "world_size": world_size,
        "config": case["config"],
        "model_class": CONFIGS[case["config"]]["architectures"][0],
        "params": params,
        "seq_len": case["seq_len"],
        "micro_batch": case["micro_batch"],
        "precision": case["precision"],
        "attention": "flash",
        "loss": "upcast",
        "checkpointing": case["checkpointing"],
        "optimizer": "adamw",
        **read_tracker(tracker, optimizer_state_bytes(optimizer)),
        "loss_value": round(loss, 4),
    }
    del tracker, optimizer, model
    gc.collect()
    return record


def worker_main(wrapper, out_path, grid):
    """Runs every case of the grid for one wrapper on this rank and writes the records."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.set_num_threads(1)  # two intra-op threads on two cores ran 4x slower than one
    if wrapper != "none":
        torch.distributed.init_process_group("gloo")
    records, errors = [], []
    for case in case_grid(grid):
        try:
            samples = [measure_case(wrapper, world_size, rank, case)
                       for _ in range(REPEATS[wrapper])]
            records.append(dict(samples[0], peak_bytes_samples=[r["peak_bytes"] for r in samples]))
        except Exception as e:  # record it and go on with the other cases
            errors.append({"id": case_id(wrapper, world_size, case),
                           "error": f"{type(e).__name__}: {e}".splitlines()[0][:500]})
            if len(errors) == 1:
                import traceback
                traceback.print_exc()
        if wrapper != "none":
            torch.distributed.barrier()
    with open(out_path, "w") as f:
        json.dump({"rank": rank, "records": records, "errors": errors}, f)
    if wrapper != "none":
        torch.distributed.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# Launcher


def run_workers(script, nproc, stem, args=(), distributed=True):
    """Runs `script` with `args` on nproc local ranks (torch.distributed.run; one plain process
    when not distributed), each writing stem-r{rank}.json, one thread each; returns (exit status,
    [per-rank result files], log file)."""
    out = ["--worker-out", stem + "-r{rank}.json"]
    if distributed:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", script, *args, *out]
    else:
        cmd = [sys.executable, script, *args, *out]
    with open(stem + ".log", "w") as log:
        rc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=log,
                            stderr=subprocess.STDOUT).returncode
    return rc, [stem + f"-r{r}.json" for r in range(nproc)], stem + ".log"


def launch(wrapper, world_size, tmpdir, grid, script=None):
    """Runs the worker processes of one run to the end (this script's workers, or `script`'s: a
    script that measures its own models with this one's machinery); returns (exit status,
    [per-rank result files], log file)."""
    return run_workers(script or os.path.abspath(__file__), world_size,
                       os.path.join(tmpdir, f"{grid}-{wrapper}-w{world_size}"),
                       ["--worker", wrapper, "--grid", grid], distributed=wrapper != "none")


def merge_ranks(files):
    """Rank 0's records (its first measurement), each with every rank's first peak and the range
    over all ranks and repeats; cases any rank failed are errors; warnings where that range is
    wider than RANK_TOLERANCE."""
    results = []
    for path in files:
        with open(path) as f:
            results.append(json.load(f))
    by_rank = [{r["id"]: r for r in res["records"]} for res in results]
    errors = {e["id"]: e["error"] for res in results for e in res["errors"]}
    merged, warnings_ = [], []
    for rec in results[0]["records"]:
        if rec["id"] in errors:
            continue
        peaks = [ranks[rec["id"]]["peak_bytes"] for ranks in by_rank]
        samples = [p for ranks in by_rank for p in ranks[rec["id"]]["peak_bytes_samples"]]
        rec = {k: v for k, v in rec.items() if k != "peak_bytes_samples"}
        rec.update(rank_peak_bytes=peaks, peak_bytes_range=[min(samples), max(samples)])
        spread = (max(samples) - min(samples)) / max(samples)
        if spread > RANK_TOLERANCE:
            warnings_.append(f"{rec['id']}: peaks over ranks and repeats span {min(samples)}.."
                             f"{max(samples)} ({spread:.1%})")
        merged.append(rec)
    return merged, errors, warnings_


def run_all(only, grid="base", script=None):
    """Launches each (wrapper, world size) run in turn (the workers of `script`, as launch);
    returns cases, failures, warnings."""
    cases, failures, warnings_ = [], {}, []
    with tempfile.TemporaryDirectory() as tmpdir:
        for wrapper, world_size in RUNS:
            name = f"{wrapper}-w{world_size}"
            if only and name not in only:
                continue
            t0 = time.time()
            rc, files, log = launch(wrapper, world_size, tmpdir, grid, script)
            if rc != 0 or not all(os.path.exists(p) for p in files):
                with open(log) as f:
                    lines = [ln for ln in f.read().splitlines() if ln.strip()]
                print("\n".join(lines[-40:]))
                failures[name] = f"exit {rc}: " + (lines[-1] if lines else "no output")
                continue
            merged, errors, rank_warnings = merge_ranks(files)
            cases += merged
            failures.update(errors)
            warnings_ += rank_warnings
            print(f"{name}: {len(merged)} cases, {len(errors)} failed, {time.time() - t0:.0f} s",
                  flush=True)
    return cases, failures, warnings_


def check_planner(planner, cases, configs):
    """`planner describe --model` on each config: it must parse and count the same parameters."""
    problems = []
    params = {c["config"]: c["params"] for c in cases}
    with tempfile.TemporaryDirectory() as tmpdir:
        for name, config in configs.items():
            path = os.path.join(tmpdir, f"{name}.json")
            with open(path, "w") as f:
                json.dump(config, f)
            out = subprocess.run([planner, "describe", "--model", path], capture_output=True,
                                 text=True)
            total = [ln.split()[-1] for ln in out.stdout.splitlines()
                     if ln.startswith("total parameters")]
            if out.returncode != 0 or not total:
                problems.append(f"planner rejects {name}: {out.stderr.strip() or out.stdout.strip()}")
            elif name in params and int(total[0]) != params[name]:
                problems.append(f"{name}: planner counts {total[0]} parameters, the model has "
                                f"{params[name]}")
    return problems


def versions():
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def command_line(args, generated_by=GENERATED_BY):
    """The command as the corpus records it: repository-relative, no machine paths."""
    out = os.path.relpath(args.out)
    if out.startswith(".."):
        out = os.path.basename(out)
    parts = ["python", generated_by, "--out", out]
    if getattr(args, "grid", "base") != "base":
        parts += ["--grid", args.grid]
    for name in args.only or []:
        parts += ["--only", name]
    return " ".join(parts)


def write_corpus(out, cases, failures, command, generated_by=GENERATED_BY, package_versions=None,
                 configs=None):
    doc = {
        "schema_version": SCHEMA_VERSION,
        "generated_by": generated_by,
        "command": command,
        "versions": package_versions or versions(),
        "configs": configs or CONFIGS,
        "cases": cases,
        "failures": [{"id": k, "error": v} for k, v in sorted(failures.items())],
    }
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def report(out, cases, failures, warnings_, started):
    """Prints what a run wrote, its failures and warnings; returns the exit status (1 on a failure)."""
    print(f"{len(cases)} cases, {len(failures)} failures in {time.time() - started:.0f} s -> {out}")
    for k, v in sorted(failures.items()):
        print(f"FAILED {k}: {v}")
    for w in warnings_:
        print(f"WARNING {w}")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/costmodel/data/oracle_steps.json")
    ap.add_argument("--only", action="append", choices=[f"{w}-w{n}" for w, n in RUNS],
                    help="run only these wrapper-world runs (repeatable)")
    ap.add_argument("--planner", help="planner executable: check that it parses each config")
    ap.add_argument("--grid", choices=sorted(GRIDS), default="base",
                    help="the cases to measure (base: oracle_steps.json; stress: "
                         "oracle_steps_stress.json)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main(args.worker, args.worker_out.format(rank=os.environ.get("RANK", "0")),
                    args.grid)
        return 0

    started = time.time()
    cases, failures, warnings_ = run_all(args.only, args.grid)
    configs = {name: CONFIGS[name] for name in GRIDS[args.grid]["configs"]}
    problems = check_planner(args.planner, cases, configs) if args.planner else []
    write_corpus(args.out, cases, failures, command_line(args), configs=configs)
    status = report(args.out, cases, failures, warnings_, started)
    for p in problems:
        print(f"PROBLEM {p}")
    return 1 if status or problems else 0


if __name__ == "__main__":
    sys.exit(main())
