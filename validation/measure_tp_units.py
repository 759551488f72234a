#!/usr/bin/env python3
"""Measure what torchtitan's own Llama keeps for backward per unit under its own tensor parallelism.

What it measures
    torchtitan 0.3.0's ``Llama3Model`` (the torchtitan-llama3-h128 config of
    validation/measure_units.py: fused wqkv, 8 heads over 2 key/value heads, causal SDPA) on 2
    ranks (gloo, CPU), both one tensor-parallel group (t = 2), parallelized as torchtitan's
    trainer does it with its default backend ("spmd_types"): ``set_llama3_sharding_config``
    with sequence parallelism (torchtitan's default, ``enable_sequence_parallel = True``),
    ``model.parallelize(parallel_dims)``, then the activation checkpointing policy (none, FullAC,
    SelectiveAC: torchtitan's per-op save list). In fp32 and without FSDP: under the spmd_types
    backend torchtitan's fully_shard wants the parameters' DTensor mesh to be its own, which its
    trainer builds and this harness does not reproduce; FSDP does not change which activations a
    block saves, and a 16-bit run saves the same tensors in the compute dtype (the 1-D corpus,
    oracle_units.json, measures both). The forward runs under the trainer's SPMD context with its inputs annotated
    (``get_spmd_context``, ``annotate_input_spmd_types``), the loss is torchtitan's
    ``CrossEntropyLoss`` with the global vocabulary (its vocabulary-parallel cross-entropy).

    The grid: checkpointing none/selective-op/full x seq 128/256 x
    micro-batch 1/2.

How it measures
    As measure_units.py: ``saved_tensors_hooks`` record every tensor autograd saves, each storage
    once, by the unit whose forward was running (embeddings, block i, head), classified as
    parameter, FSDP's unsharded parameter, buffer, weight copy or activation. SelectiveAC's cache
    is routed through the hooks (``respect_saved_tensors_hooks=True``), and torchtitan's save list
    gains the CPU twin of the CUDA flash SDPA op, as measure_units.py does, so the CPU run keeps
    what a GPU run keeps. Rank 0's units are recorded (the two ranks keep the same shapes); the
    record has the first step's loss and the loss of the same model and batch on one process
    without parallelism (they must agree).

Usage
    python validation/measure_tp_units.py --out tests/costmodel/data/oracle_tp_units.json
    (about a minute on two cores)
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure_steps as ms  # noqa: E402  (the worker launcher)
import measure_units as mu  # noqa: E402  (the recorder, the storage classifier, the unit summary)

GENERATED_BY = "validation/measure_tp_units.py"
CONFIG = "torchtitan-llama3-h128"
TP = 2
PRECISIONS = ("fp32",)
CHECKPOINTING = ("none", "selective-op", "full")
SEQ_LENS = (128, 256)
MICRO_BATCHES = (1, 2)
LOSS_TOLERANCE = {"fp32": 1e-4}  # relative, against one process


def case_grid():
    for precision in PRECISIONS:
        for checkpointing in CHECKPOINTING:
            for seq_len in SEQ_LENS:
                for micro_batch in MICRO_BATCHES:
                    yield {"config": CONFIG, "precision": precision,
                           "checkpointing": checkpointing, "seq_len": seq_len,
                           "micro_batch": micro_batch}


def case_id(case):
    return (f"tp{TP}-sp/{case['config']}/{case['precision']}/{case['checkpointing']}/"
            f"s{case['seq_len']}-b{case['micro_batch']}")


def build_model(case, tp):
    """Llama3Model as torchtitan's trainer parallelizes it (see the module docstring); tp = 1 is
    the one-process reference."""
    import torch
    from torchtitan.distributed import ParallelDims
    from torchtitan.models.llama3.sharding import set_llama3_sharding_config

    config = mu.torchtitan_model_config(case["config"], case["seq_len"])
    set_llama3_sharding_config(config, enable_sp=True)
    torch.manual_seed(0)
    model = config.build()
    model.init_states(buffer_device=torch.device("cpu"))
    model.train()
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=tp, pp=1, ep=1,
                        world_size=torch.distributed.get_world_size())
    if tp > 1:
        model.parallelize(dims)
    mu.apply_torchtitan_ac(model, case["checkpointing"])
    return model, dims


def run_step(case, tp, recorder=None):
    """One forward, torchtitan's loss and the backward; returns (loss, model)."""
    import spmd_types as spmd
    import torch
    import torchtitan.distributed.utils as dist_utils
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.distributed.spmd_types import annotate_input_spmd_types

    model, dims = build_model(case, tp)
    V = mu.TORCHTITAN_ARGS[case["config"]]["vocab_size"]
    torch.manual_seed(1)
    shape = (case["micro_batch"], case["seq_len"])
    ids, labels = torch.randint(0, V, shape), torch.randint(0, V, shape)
    loss_fn = CrossEntropyLoss.Config(global_vocab_size=V).build()
    context = dist_utils.get_spmd_context(parallel_dims=dims if tp > 1 else None)
    classifier = None
    with context():
        if tp > 1:
            ids, labels, _ = annotate_input_spmd_types(dims, ids, labels, {})
        if recorder is not None:
            classifier = mu.StorageClassifier(model)
            mu.install_unit_markers(recorder, list(model.layers.values()), model.norm)
            recorder.set_unit(mu.UNIT_EMBEDDING)
            with recorder.hooks():
                pred = model(ids)
                loss, _ = loss_fn(pred, labels, torch.tensor(labels.numel()))
            classifier.note_fsdp_unsharded(model)
        else:
            pred = model(ids)
            loss, _ = loss_fn(pred, labels, torch.tensor(labels.numel()))
        del pred
        with spmd.no_typecheck():
            loss.backward()
    return float(loss.detach()), model, classifier


def worker_main(out_path):
    import torch
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.distributed.utils as dist_utils

    # torchtitan picks "cuda" when no accelerator is found; these ranks are CPU ranks.
    parallel_dims.device_type = "cpu"
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    dist_utils.set_spmd_backend("spmd_types")
    rank = torch.distributed.get_rank()
    n_layers = mu.TORCHTITAN_ARGS[CONFIG]["n_layers"]
    records, errors = [], []
    for case in case_grid():
        t0 = time.time()
        try:
            recorder = mu.SavedTensorRecorder()
            loss, model, classifier = run_step(case, TP, recorder)
            units = mu.summarise_units(recorder, classifier, n_layers, with_tensors=True)
            records.append({"id": case_id(case), **case, "tensor_parallel": TP,
                            "sequence_parallel": True, "recipe": "torchtitan",
                            "attention": "flash", "loss": "upcast", "units": units,
                            "first_step_loss": round(loss, 5)})
            del recorder, model, classifier
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


def reference_main(out_path):
    """One process, no parallelism: the loss each case must reproduce."""
    import torch
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.distributed.utils as dist_utils
    parallel_dims.device_type = "cpu"
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo", init_method="file://" + tempfile.mktemp(prefix="pg-"), rank=0, world_size=1)
    dist_utils.set_spmd_backend("spmd_types")
    losses = {case_id(c): round(run_step(c, 1)[0], 5) for c in case_grid()}
    with open(out_path, "w") as f:
        json.dump(losses, f)
    torch.distributed.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/costmodel/data/oracle_tp_units.json")
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--reference-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reference_out:  # (run_workers adds a --worker-out this mode does not use)
        reference_main(args.reference_out)
        return 0
    if args.worker_out:
        worker_main(args.worker_out.format(rank=os.environ.get("RANK", "0")))
        return 0
    from importlib.metadata import version
    started = time.time()
    with tempfile.TemporaryDirectory() as tmpdir:
        rc, files, log = ms.run_workers(os.path.abspath(__file__), TP, os.path.join(tmpdir, "tp"))
        if rc != 0 or not os.path.exists(files[0]):
            print(open(log).read()[-4000:])
            return 1
        ref_path = os.path.join(tmpdir, "reference.json")
        rc, _, log = ms.run_workers(os.path.abspath(__file__), 1, os.path.join(tmpdir, "ref"),
                                    ["--reference-out", ref_path], distributed=False)
        if rc != 0:
            print(open(log).read()[-4000:])
            return 1
        with open(files[0]) as f:
            rank0 = json.load(f)
        with open(ref_path) as f:
            reference = json.load(f)
    failures = {e["id"]: e["error"] for e in rank0["errors"]}
    cases = []
    for r in rank0["records"]:
        r["reference_loss"] = reference[r["id"]]
        if abs(r["first_step_loss"] - r["reference_loss"]) > \
                LOSS_TOLERANCE[r["precision"]] * abs(r["reference_loss"]):
            failures[r["id"]] = (f"loss {r['first_step_loss']} differs from the one-process loss "
                                 f"{r['reference_loss']}")
        cases.append(r)
    out = os.path.relpath(args.out)
    corpus = {
        "schema_version": 1,
        "generated_by": GENERATED_BY,
        "command": " ".join(["python", GENERATED_BY, "--out",
                             out if not out.startswith("..") else os.path.basename(out)]),
        "versions": {name: version(name) for name in ("torch", "torchtitan")},
        "configs": {CONFIG: dict(mu.CONFIGS[CONFIG])},  # its shapes as an HF config
        "torchtitan_args": {CONFIG: mu.TORCHTITAN_ARGS[CONFIG]},
        "cases": cases,
        "failures": failures,
    }
    with open(args.out, "w") as f:
        json.dump(corpus, f, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases, {len(failures)} failures, {time.time() - started:.0f} s: {args.out}")
    for k, v in failures.items():
        print(f"  FAILED {k}: {v}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
