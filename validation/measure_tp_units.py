#!/usr/bin/env python3
"""Measure what torchtitan's own Llama keeps for backward per unit under its own tensor parallelism,
eager and torch.compile'd.

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

    Compiled (mode "compiled", ``"compile": true``, ids ``tp2-sp-compiled/...``): torchtitan's
    ``--compile.enable`` where ``torchtitan.models.llama3.parallelize.parallelize_llama`` applies it:
    after ``model.parallelize`` and the checkpointing policy, the real
    ``torchtitan.distributed.compile.apply_compile`` (every child of ``model.layers`` compiled with
    ``nn.Module.compile(backend="inductor", fullgraph=True)``: the block, its tensor-parallel
    collectives included, is one Dynamo graph; embeddings, final norm and lm_head stay eager), and
    the loss built with the compile config (``CompileConfig.components`` defaults to
    ``["model", "loss"]``: the vocabulary-parallel cross-entropy compiled, loss "fused" as in
    oracle_compile_units.json). Every compiled case starts from ``torch._dynamo.reset()`` with
    Inductor's and AOTAutograd's caches off (a first, static-shape compile). SelectiveAC compiles:
    its policy tags the traced ops and the partitioner keeps, of what backward needs, the tagged
    ones; traced, the spmd_types collectives are functional collectives, so the save list's
    ``_c10d_functional.reduce_scatter_tensor`` applies to them (eager, it does not).

    The grid: mode eager/compiled x checkpointing none/selective-op/full x seq 128/256 x
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

    Eager blocks are marked by forward pre-hooks. A compiled block's forward pre-hooks run inside
    its compiled call, so, as measure_compile_units.py does it (its helpers are imported), the unit
    is set by a wrapper around the block's ``_compiled_call_impl`` (outside the compiled region);
    AOTAutograd's compiled function saves with ``ctx.save_for_backward``, which goes through the
    hooks entered around the forward. Each compiled record also has:
    ``block0_saved_tensors`` (block 0's saved tensors one by one: shape, dtype, stride, bytes, class,
    name for parameters, buffers and the block input, and the forward-graph output it is: FX node,
    ATen op, module in the block, source call), ``reference_loss`` and ``one_rank_compiled_units``
    from the same case compiled on one process without parallelism, and ``eager_reference_loss``
    (one process, eager).

Usage
    python validation/measure_tp_units.py --out tests/costmodel/data/oracle_tp_units.json
    (about five minutes on two cores, most of it compiling; --only TEXT[,TEXT] runs the cases
    whose id contains one of the texts, for debugging)
"""

import argparse
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure_steps as ms  # noqa: E402  (the worker launcher)
import measure_units as mu  # noqa: E402  (the recorder, the storage classifier, the unit summary)

GENERATED_BY = "validation/measure_tp_units.py"
CONFIG = "torchtitan-llama3-h128"
TP = 2
MODES = ("eager", "compiled")
PRECISIONS = ("fp32",)
CHECKPOINTING = ("none", "selective-op", "full")
SEQ_LENS = (128, 256)
MICRO_BATCHES = (1, 2)
LOSS_TOLERANCE = {"fp32": 1e-4}  # relative, against one process

COMPILE_RECIPE = {
    "function": "torchtitan.distributed.compile.apply_compile",
    "called_as": "torchtitan.models.llama3.parallelize.parallelize_llama: model.parallelize, then "
                 "activation checkpointing, then apply_compile (then FSDP, not applied here)",
    "per_block": "transformer_block.compile(backend='inductor', fullgraph=True) for every child of "
                 "model.layers (the CheckpointWrapper under checkpointing)",
    "loss": "CrossEntropyLoss built with CompileConfig(enable=True) (components 'model' and 'loss')",
    "caches": "torch._dynamo.reset() per case; Inductor FX graph cache and AOTAutograd cache off",
}


def case_grid(only=None):
    for mode in MODES:
        for precision in PRECISIONS:
            for checkpointing in CHECKPOINTING:
                for seq_len in SEQ_LENS:
                    for micro_batch in MICRO_BATCHES:
                        case = {"config": CONFIG, "precision": precision,
                                "checkpointing": checkpointing, "seq_len": seq_len,
                                "micro_batch": micro_batch, "compile": mode == "compiled"}
                        if not only or any(t in case_id(case) for t in only.split(",")):
                            yield case


def case_id(case):
    mode = "-compiled" if case["compile"] else ""
    return (f"tp{TP}-sp{mode}/{case['config']}/{case['precision']}/{case['checkpointing']}/"
            f"s{case['seq_len']}-b{case['micro_batch']}")


def compile_setup(observe=True):
    """Caches off (every graph compiled in the run) and measure_compile_units' observer of
    Inductor's graphs (its forward graph's outputs name the saved tensors; it wraps Inductor's
    codegen, so one per process). Imported here: that module points Inductor at a fresh cache
    directory when it is imported."""
    import torch
    import torch._inductor.config as inductor_config
    import measure_compile_units as mcu
    inductor_config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    return mcu.InductorObserver() if observe else None


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
    if case["compile"]:
        from torchtitan.config import CompileConfig
        from torchtitan.distributed.compile import apply_compile
        apply_compile(model, compile_config=CompileConfig(enable=True), parallel_dims=dims)
    return model, dims


def build_loss(case):
    from torchtitan.components.loss import CrossEntropyLoss
    from torchtitan.config import CompileConfig
    V = mu.TORCHTITAN_ARGS[case["config"]]["vocab_size"]
    loss = CrossEntropyLoss.Config(global_vocab_size=V)
    return loss.build(compile_config=CompileConfig(enable=True)) if case["compile"] else loss.build()


def install_markers(case, recorder, model):
    """Unit markers: forward pre-hooks (eager), the compiled call's wrapper (compiled blocks)."""
    import measure_compile_units as mcu
    layers = list(model.layers.values())
    if not case["compile"]:
        return mu.install_unit_markers(recorder, layers, model.norm), None
    handles = [model.norm.register_forward_pre_hook(lambda *_: recorder.set_unit(mu.UNIT_HEAD))]
    return handles, mcu.CompiledBlockMarkers(recorder, layers)


def block0_detail(recorder, classifier, model, markers, observer):
    """Block 0's saved tensors one by one with their forward-graph provenance (compiled)."""
    import measure_compile_units as mcu
    names = {b.untyped_storage()._cdata: n for n, b in model.named_buffers()}
    names.update({p.untyped_storage()._cdata: n for n, p in model.named_parameters()})
    fw = next((g for g in observer.graphs if g.get("unit") == "block" and g["pass"] == "forward"),
              None) if observer is not None else None
    rows, matched = mcu.block_tensor_list(recorder, classifier, "block 0", names, markers.inputs, fw)
    for row in rows:  # module paths inside spmd_types' forward wrappers, block-relative
        out = row.get("graph_output") or {}
        if out.get("module"):
            out["module"] = re.sub(r"\.?forward\.__closure__\[\d+\]\.cell_contents\.__self__", "",
                                   out["module"])
    return {"block0_saved_tensors": rows, "block0_saved_tensors_match_graph_outputs": matched}


def run_step(case, tp, recorder=None, observer=None):
    """One forward, torchtitan's loss and the backward; returns (loss, model, classifier, extra):
    extra has block 0's tensor list for a recorded compiled case."""
    import spmd_types as spmd
    import torch
    import torchtitan.distributed.utils as dist_utils
    from torchtitan.distributed.spmd_types import annotate_input_spmd_types

    if case["compile"]:
        torch._dynamo.reset()
    model, dims = build_model(case, tp)
    V = mu.TORCHTITAN_ARGS[case["config"]]["vocab_size"]
    torch.manual_seed(1)
    shape = (case["micro_batch"], case["seq_len"])
    ids, labels = torch.randint(0, V, shape), torch.randint(0, V, shape)
    loss_fn = build_loss(case)
    context = dist_utils.get_spmd_context(parallel_dims=dims if tp > 1 else None)
    classifier, extra = None, {}
    with context():
        if tp > 1:
            ids, labels, _ = annotate_input_spmd_types(dims, ids, labels, {})
        if recorder is not None:
            classifier = mu.StorageClassifier(model)
            handles, markers = install_markers(case, recorder, model)
            if observer is not None:
                observer.start_case(recorder)
            recorder.set_unit(mu.UNIT_EMBEDDING)
            with recorder.hooks():
                pred = model(ids)
                loss, _ = loss_fn(pred, labels, torch.tensor(labels.numel()))
            classifier.note_fsdp_unsharded(model)
            if markers is not None:
                extra = block0_detail(recorder, classifier, model, markers, observer)
                markers.remove()
            for h in handles if case["compile"] else ():
                h.remove()
        else:
            pred = model(ids)
            loss, _ = loss_fn(pred, labels, torch.tensor(labels.numel()))
        del pred
        with spmd.no_typecheck():
            loss.backward()
    return float(loss.detach()), model, classifier, extra


def measure_case(case, observer):
    """Rank 0's record of one case (rank 1 runs the same)."""
    recorder = mu.SavedTensorRecorder()
    loss, model, classifier, extra = run_step(case, TP, recorder, observer)
    n_layers = mu.TORCHTITAN_ARGS[CONFIG]["n_layers"]
    units = mu.summarise_units(recorder, classifier, n_layers, with_tensors=True)
    record = {"id": case_id(case), **case, "tensor_parallel": TP,
              "sequence_parallel": True, "recipe": "torchtitan",
              "attention": "flash", "loss": "fused" if case["compile"] else "upcast",
              "units": units, "first_step_loss": round(loss, 5)}
    record.update(extra)
    return record


def worker_main(out_path, only):
    import torch
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.distributed.utils as dist_utils

    # torchtitan picks "cuda" when no accelerator is found; these ranks are CPU ranks.
    parallel_dims.device_type = "cpu"
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    dist_utils.set_spmd_backend("spmd_types")
    rank = torch.distributed.get_rank()
    records, errors, observer = [], [], None
    for case in case_grid(only):
        t0 = time.time()
        try:
            if case["compile"] and observer is None:
                observer = compile_setup()
            records.append(measure_case(case, observer if case["compile"] else None))
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


def reference_main(out_path, only):
    """One process, no parallelism: the loss each case must reproduce; compiled cases also give
    their per-unit bytes compiled on one rank."""
    import torch
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.distributed.utils as dist_utils
    parallel_dims.device_type = "cpu"
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo", init_method="file://" + tempfile.mktemp(prefix="pg-"), rank=0, world_size=1)
    dist_utils.set_spmd_backend("spmd_types")
    out = {"losses": {}, "units": {}, "errors": {}}
    n_layers = mu.TORCHTITAN_ARGS[CONFIG]["n_layers"]
    # An eager loss is needed for its own case and for its compiled twin.
    wanted = {case_id(dict(c, compile=m)) for c in case_grid(only) for m in {False, c["compile"]}}
    for c in case_grid():
        if case_id(c) not in wanted:
            continue
        try:
            if not c["compile"]:
                out["losses"][case_id(c)] = round(run_step(c, 1)[0], 5)
                continue
            compile_setup(observe=False)
            recorder = mu.SavedTensorRecorder()
            loss, _, classifier, _ = run_step(c, 1, recorder)
            out["losses"][case_id(c)] = round(loss, 5)
            out["units"][case_id(c)] = mu.summarise_units(recorder, classifier, n_layers, False)
        except Exception as e:  # reported as the case's failure
            out["errors"][case_id(c)] = f"one process: {type(e).__name__}: {e}"[:500]
    with open(out_path, "w") as f:
        json.dump(out, f)
    torch.distributed.destroy_process_group()


def check_records(records, reference):
    """Adds the one-process losses (and units) to each record; returns the failures."""
    failures = dict(reference["errors"])
    for r in records:
        checks = [("reference_loss", case_id(r))]
        if r["compile"]:
            checks.append(("eager_reference_loss", case_id(dict(r, compile=False))))
            if case_id(r) in reference["units"]:
                r["one_rank_compiled_units"] = reference["units"][case_id(r)]
        for field, ref_id in checks:
            if ref_id not in reference["losses"]:
                failures.setdefault(r["id"], f"no one-process loss ({ref_id})")
                continue
            ref = r[field] = reference["losses"][ref_id]
            if abs(r["first_step_loss"] - ref) > LOSS_TOLERANCE[r["precision"]] * abs(ref):
                failures[r["id"]] = (f"loss {r['first_step_loss']} differs from the one-process "
                                     f"loss {ref} ({field})")
    return failures


def run_all(only):
    """The two ranks, then the one-process references; returns (rank 0's results, reference)."""
    extra = ["--only", only] if only else []
    with tempfile.TemporaryDirectory() as tmpdir:
        rc, files, log = ms.run_workers(os.path.abspath(__file__), TP, os.path.join(tmpdir, "tp"),
                                        extra)
        if rc != 0 or not os.path.exists(files[0]):
            print(open(log).read()[-4000:])
            return None, None
        ref_path = os.path.join(tmpdir, "reference.json")
        rc, _, log = ms.run_workers(os.path.abspath(__file__), 1, os.path.join(tmpdir, "ref"),
                                    ["--reference-out", ref_path, *extra], distributed=False)
        if rc != 0:
            print(open(log).read()[-4000:])
            return None, None
        with open(files[0]) as f:
            rank0 = json.load(f)
        with open(ref_path) as f:
            reference = json.load(f)
    return rank0, reference


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/costmodel/data/oracle_tp_units.json")
    ap.add_argument("--only", default=None,
                    help="debugging: run only the cases whose id contains one of these "
                         "comma-separated texts")
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--reference-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reference_out:  # (run_workers adds a --worker-out this mode does not use)
        reference_main(args.reference_out, args.only)
        return 0
    if args.worker_out:
        worker_main(args.worker_out.format(rank=os.environ.get("RANK", "0")), args.only)
        return 0
    from importlib.metadata import version
    started = time.time()
    rank0, reference = run_all(args.only)
    if rank0 is None:
        return 1
    failures = {e["id"]: e["error"] for e in rank0["errors"]}
    failures.update(check_records(rank0["records"], reference))
    out = os.path.relpath(args.out)
    command = ["python", GENERATED_BY, "--out",
               out if not out.startswith("..") else os.path.basename(out)]
    corpus = {
        "schema_version": 1,
        "generated_by": GENERATED_BY,
        "command": " ".join(command + (["--only", args.only] if args.only else [])),
        "versions": {name: version(name) for name in ("torch", "torchtitan")},
        "configs": {CONFIG: dict(mu.CONFIGS[CONFIG])},  # its shapes as an HF config
        "torchtitan_args": {CONFIG: mu.TORCHTITAN_ARGS[CONFIG]},
        "compile_recipe": COMPILE_RECIPE,
        "cases": rank0["records"],
        "failures": failures,
    }
    with open(args.out, "w") as f:
        json.dump(corpus, f, indent=1)
        f.write("\n")
    print(f"{len(corpus['cases'])} cases, {len(failures)} failures, "
          f"{time.time() - started:.0f} s: {args.out}")
    for k, v in failures.items():
        print(f"  FAILED {k}: {v}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
