#!/usr/bin/env python3
"""Measure the memory of FSDP2 + tensor-parallel (2-D) training steps with PyTorch's own code.

What it measures
    One training step of ``transformers.LlamaForCausalLM`` (the llama-h256 config of
    validation/measure_steps.py, float32 parameters, dropout 0, sdpa attention) on 4 ranks (gloo,
    CPU) laid out as torchtitan lays out its 2-D parallelism: a DeviceMesh of shape (2, 2) named
    ("dp_shard", "tp"), tensor parallelism innermost (torchtitan/distributed/parallel_dims.py
    builds the mesh with tp last). Each rank is one TP rank of a TP pair and one FSDP rank of a
    data-parallel pair; the two data-parallel groups see different batches.

    The model's RMSNorms are torch.nn.RMSNorm, the norm torchtitan's Llama uses
    (torchtitan/models/llama3/model/model.py), with HF's weights: transformers' LlamaRMSNorm casts
    the normalized value back to the input dtype before the weight multiply, so under bf16
    parameters it keeps a bf16 copy where torchtitan's keeps an fp32 one (in fp32 the two keep the
    same tensors). The attention, MLP, embedding and head are HF's code.

    First the TP "sp" layout of validation/measure_tensor_parallel.py (torchtitan's sequence-
    parallel plan, imported from there) on the "tp" sub-mesh, then FSDP2 on the "dp_shard" sub-mesh
    as torchtitan's apply_fsdp does it (torchtitan/models/llama3/infra/parallelize.py):
    ``fully_shard`` on the token embedding, on each decoder block, on the final norm and the head
    together, then on the root, with torchtitan's "default" reshard_after_forward policy for a run
    without pipeline parallelism: True for the embedding and the blocks, False for the
    [norm, head] group ("always" only would reshard it), and the root left to fully_shard's own
    default (None: the root keeps its parameters, here none of its own). ``fully_shard`` shards
    each TP-local tensor over dp_shard on dim 0 (2-D DTensors, (Shard(0), tp placement)).

    Precisions: "fp32" (no MixedPrecisionPolicy) and "bf16-mixed"
    (``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``, torchtitan's default
    mixed_precision_param / mixed_precision_reduce). The loss is torchtitan's, under
    ``loss_parallel()``, as measure_tensor_parallel.py's "sp" step runs it. Optimizer
    ``torch.optim.AdamW(lr=1e-3, foreach=True)`` over the 2-D DTensor parameters (one group),
    ``zero_grad(set_to_none=True)``.

    The grid: precision fp32/bf16-mixed x checkpointing none/full (HF's non-reentrant gradient
    checkpointing of every block) x seq 128/256 x micro-batch 1/2.

How it measures
    As validation/measure_steps.py measures its "fsdp2" runs: ``FSDPMemTracker`` (without its
    post-backward reference to a gradient, and with gloo's reduce-scatter copies counted apart:
    fsdp2_on_gloo.py says why) over the second step, after one warm-up step, with the model,
    optimizer and batch registered; storage bytes per category (DTensors by their local
    shards), the categories at the peak, each category's own peak, the module and phase of the
    peak. FSDP2's peaks at the end of the backward vary
    with when gloo's threads release collective buffers, so each case is measured REPEATS times
    per rank; peak_bytes_range is [min, max] over ranks and repeats. Each record has the first
    step's loss of rank 0 (data-parallel rank 0's batch) and the loss of the same model and batch
    in one process without any parallelism (they must agree within LOSS_TOLERANCE).

    The tracker also keeps the hooks of the [norm, head] group as FSDP2 has them
    (fsdp2_on_gloo.FSDPGroupHooksProbe, as validation/measure_accelerate_steps.py mixes it in).
    ``fully_shard([model.model.norm, model.lm_head])`` makes one FSDPState for both modules, whose
    forward hooks ``_register_group_forward_hooks`` (torch/distributed/fsdp/_fully_shard/
    _fsdp_state.py) registers so that the full ``_post_forward`` runs once, after the group's
    last module. ``FSDPMemTracker._instrument_fsdp_module`` (torch 2.15,
    torch/distributed/_tools/fsdp2_mem_tracker.py) replaces that handle with ``_pre_forward`` and
    ``_post_forward`` on each module, and wraps the group's ``pre_backward``/``post_backward``
    once per module, so in the tracked step's backward the group is reduce-scattered once per
    module, on hooks an untracked step does not have. The probe registers the tracker's wrappers
    through ``_register_group_forward_hooks`` with the state's own ``_modules_to_run_forward``
    and ``_cast_output_dtype``, wraps the group's ``pre_backward``/``post_backward`` once, and
    restores the grouped hooks on exit; the groups of one module (the embedding, each block, the
    root) are instrumented by FSDPMemTracker's own code. Here the group is not resharded after
    the forward and no peak falls in its reduce-scatters, so the peaks are the same either way;
    what changes is the reduce-scatter category's own peak (and gloo's copies'): one buffer for
    the norm's and the head's gradients together instead of one per module.

Usage
    python validation/measure_fsdp_tp.py --out tests/costmodel/data/oracle_fsdp_tp.json
    (3 to 10 minutes on two cores, as busy as they are)
"""

import argparse
import gc
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure_steps as ms  # noqa: E402  (the shared model, batch, tracker and corpus code)
from fsdp2_on_gloo import (FSDPGroupHooksProbe, FSDPPostBackwardProbe,  # noqa: E402
                           gloo_copies_counted)
import measure_tensor_parallel as mtp  # noqa: E402  (the TP "sp" layout, its step and loss)

GENERATED_BY = "validation/measure_fsdp_tp.py"
CONFIG = "llama-h256"
DP_SHARD = 2
TP = 2
LAYOUT = "sp"
PRECISIONS = ("fp32", "bf16-mixed")
CHECKPOINTING = ("none", "full")
SEQ_LENS = (128, 256)
MICRO_BATCHES = (1, 2)
REPEATS = 2  # measurements per case and rank (see "How it measures")
LOSS_TOLERANCE = {"fp32": 1e-4, "bf16-mixed": 2e-2}  # relative, against one process


def case_grid():
    for precision in PRECISIONS:
        for checkpointing in CHECKPOINTING:
            for seq_len in SEQ_LENS:
                for micro_batch in MICRO_BATCHES:
                    yield {"layout": LAYOUT, "config": CONFIG, "seq_len": seq_len,
                           "micro_batch": micro_batch, "precision": precision,
                           "checkpointing": checkpointing}


def case_id(case):
    return (f"fsdp{DP_SHARD}-tp{TP}-{case['layout']}/{case['config']}/{case['precision']}/"
            f"{case['checkpointing']}/s{case['seq_len']}-b{case['micro_batch']}")


def use_torch_rmsnorm(model):
    """Every LlamaRMSNorm replaced by torch.nn.RMSNorm (torchtitan's norm), same weight and eps."""
    import torch

    def swap(norm):
        new = torch.nn.RMSNorm(norm.weight.shape[0], eps=norm.variance_epsilon)
        with torch.no_grad():
            new.weight.copy_(norm.weight)
        return new

    for layer in model.model.layers:
        layer.input_layernorm = swap(layer.input_layernorm)
        layer.post_attention_layernorm = swap(layer.post_attention_layernorm)
    model.model.norm = swap(model.model.norm)
    return model


def apply_fsdp(model, mesh, precision):
    """fully_shard as torchtitan's apply_fsdp calls it without pipeline parallelism (see the
    module docstring): the embedding, each block, [final norm, head], the root."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs = {"mesh": mesh}
    if precision == "bf16-mixed":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                   reduce_dtype=torch.float32)
    fully_shard(model.model.embed_tokens, **kwargs, reshard_after_forward=True)
    for layer in model.model.layers:
        fully_shard(layer, **kwargs, reshard_after_forward=True)
    fully_shard([model.model.norm, model.lm_head], **kwargs, reshard_after_forward=False)
    fully_shard(model, **kwargs)
    return model


def make_tracker(model, optimizer, ids):
    """measure_steps.py's FSDPMemTracker probe with FSDPGroupHooksProbe mixed in, which keeps the
    [norm, head] group's hooks as FSDP2 registers them (see "How it measures")."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    class ProbedFSDPMemTracker(ms._PeakProbe, FSDPGroupHooksProbe, FSDPPostBackwardProbe,
                               FSDPMemTracker):
        pass

    tracker = ProbedFSDPMemTracker(model, optimizer)
    tracker.track_inputs((ids,))
    tracker._probe_init()
    return tracker


def measure_case(mesh, case):
    import torch

    model = ms.build_model(case["config"], case["checkpointing"])
    params = ms.parameter_count(model)
    use_torch_rmsnorm(model)
    mtp.apply_tp(model, mesh["tp"], case["layout"])
    apply_fsdp(model, mesh["dp_shard"], case["precision"])
    optimizer = mtp.make_optimizer(model)
    dp_rank = mesh["dp_shard"].get_local_rank()
    ids = ms.make_batch(case["config"], case["seq_len"], case["micro_batch"], dp_rank)
    first_loss = mtp.train_step(model, optimizer, ids, case["layout"])
    gc.collect()
    tracker = make_tracker(model, optimizer, ids)
    with tracker, gloo_copies_counted(tracker):
        mtp.train_step(model, optimizer, ids, case["layout"])
    local = sum(p.to_local().numel() for p in model.parameters())
    record = {
        "id": case_id(case),
        "layout": case["layout"],
        "tensor_parallel": TP,
        "sequence_parallel": True,
        "data_parallel_shard": DP_SHARD,
        "world_size": DP_SHARD * TP,
        "reshard_after_forward": {"embedding": True, "blocks": True, "norm_and_head": False},
        "config": case["config"],
        "params": params,
        "local_params": local,
        "seq_len": case["seq_len"],
        "micro_batch": case["micro_batch"],
        "precision": case["precision"],
        "checkpointing": case["checkpointing"],
        "optimizer": "adamw",
        **ms.read_tracker(tracker, ms.optimizer_state_bytes(optimizer)),
        "dp_rank": dp_rank,
        "first_step_loss": round(first_loss, 5),
        "reference_loss": round(mtp.reference_loss(case, ids), 5),
    }
    del tracker, optimizer, model
    gc.collect()
    torch.distributed.barrier()
    return record


def worker_main(out_path):
    import json

    import torch
    import transformers
    from torch.distributed.device_mesh import init_device_mesh

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    mesh = init_device_mesh("cpu", (DP_SHARD, TP), mesh_dim_names=("dp_shard", "tp"))
    records, errors = [], []
    for case in case_grid():
        t0 = time.time()
        try:
            samples = [measure_case(mesh, case) for _ in range(REPEATS)]
            records.append(dict(samples[0], peak_bytes_samples=[r["peak_bytes"] for r in samples]))
        except Exception as e:  # record it and go on
            errors.append({"id": case_id(case), "error": f"{type(e).__name__}: {e}"[:500]})
            if len(errors) == 1:
                import traceback
                traceback.print_exc()
        torch.distributed.barrier()
        print(f"rank {rank} {case_id(case)}: {time.time() - t0:.1f} s", flush=True)
    with open(out_path, "w") as f:
        json.dump({"rank": rank, "records": records, "errors": errors}, f)
    torch.distributed.destroy_process_group()


def check_losses(cases, failures):
    """A case whose first-step loss differs from the one-process loss is a failure."""
    for c in cases:
        ref, got = c["reference_loss"], c["first_step_loss"]
        if abs(got - ref) > LOSS_TOLERANCE[c["precision"]] * abs(ref):
            failures[c["id"]] = f"loss {got} differs from the one-process loss {ref}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/costmodel/data/oracle_fsdp_tp.json")
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_out:
        worker_main(args.worker_out.format(rank=os.environ.get("RANK", "0")))
        return 0
    started = time.time()
    with tempfile.TemporaryDirectory() as tmpdir:
        rc, files, log = ms.run_workers(os.path.abspath(__file__), DP_SHARD * TP,
                                        os.path.join(tmpdir, "fsdp-tp"))
        if rc != 0 or not all(os.path.exists(p) for p in files):
            print(open(log).read()[-4000:])
            return 1
        cases, failures, warnings_ = ms.merge_ranks(files)
    check_losses(cases, failures)
    out = os.path.relpath(args.out)
    command = " ".join(["python", GENERATED_BY, "--out",
                        out if not out.startswith("..") else os.path.basename(out)])
    ms.write_corpus(args.out, cases, failures, command, generated_by=GENERATED_BY,
                    configs={CONFIG: ms.CONFIGS[CONFIG]})
    return ms.report(args.out, cases, failures, warnings_, started)


if __name__ == "__main__":
    sys.exit(main())
