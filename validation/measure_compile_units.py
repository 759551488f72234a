#!/usr/bin/env python3
"""Measure what torch.compile (Inductor, CPU) makes torchtitan's Llama block keep for backward, and the bytes
its generated kernels move.

What it measures
    torchtitan 0.3.0's ``Llama3Model`` (the torchtitan-llama3-h128 config of validation/measure_units.py: fused
    wqkv, 8 heads over 2 key/value heads, causal SDPA, ComplexRoPE; and the same with 4 key/value heads) built
    and parallelized as measure_units.py does it on one rank, with torchtitan's ``--compile.enable`` added where
    ``torchtitan.models.llama3.parallelize.parallelize_llama`` adds it: activation checkpointing first (none, or
    ``FullAC``), then ``torchtitan.distributed.compile.apply_compile`` (the real function: it sets
    ``torch._dynamo.config.capture_scalar_outputs`` and ``skip_fwd_side_effects_in_bwd_under_checkpoint`` and
    calls ``transformer_block.compile(backend="inductor", fullgraph=True)`` on every child of ``model.layers``,
    i.e. ``nn.Module.compile``: the block's ``_call_impl`` is compiled, the embedding, final norm and lm_head stay
    eager), then FSDP2 (``apply_fsdp_to_decoder`` on a 1-rank gloo mesh; bf16-mixed is its
    ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``). ``CompileConfig``'s default components are
    ``["model", "loss"]``, so the compiled cases also compile the loss (``CrossEntropyLoss`` built with the
    compile config: measure_units.py's loss "fused"). Every compiled case starts from ``torch._dynamo.reset()``:
    a first, static-shape compile, as in a fixed-shape training run. The three blocks share one compiled graph
    (same structure, parameters are graph inputs), so each case compiles one block forward and one block
    backward graph (lazily, at the first backward), plus the loss's two.

    For comparison every case also runs eager (no compile, loss "upcast"): the exact case of measure_units.py
    (same builders), whose per-unit bytes must equal oracle_units.json's rows with the same id where that corpus
    has the shape (the script prints the comparison; the corpus does not depend on it).

    Grid: config (h128 kv2, h128 kv4) x precision (fp32, bf16-mixed) x checkpointing (none, full)
    x seq 64/128 x micro-batch 1/2 x mode (eager, compiled).

How it measures
    Saved tensors: measure_units.py's ``SavedTensorRecorder`` (``saved_tensors_hooks`` around forward and
    loss) and ``StorageClassifier``/``summarise_units`` (each storage once, in the first unit that saved it;
    parameter, buffer, fsdp_unsharded_param, weight_copy, activation). AOTAutograd's compiled function saves
    with ``ctx.save_for_backward``, which goes through hooks entered outside the compiled call. Unit markers:
    a compiled block's forward pre-hooks run inside the compiled ``_call_impl`` (Dynamo would trace them), so
    for compiled blocks the unit is set by a wrapper around the block's ``_compiled_call_impl`` (eager: the
    forward pre-hooks of measure_units.py). For the first shape of every (config, precision, checkpointing,
    mode) the record lists block 0's saved tensors one by one (``block0_saved_tensors``): shape, dtype, stride,
    the tensor's own bytes, its storage's bytes, whether that storage was already counted (a view), its class,
    and, compiled, the forward-graph output it is (the FX node, its ATen op, the module and source call it
    comes from: the graph's node metadata) or, for graph inputs, the parameter/buffer/block input.

    Kernels: ``GraphLowering.codegen`` is wrapped (observation only) to record, per compiled graph (block or
    loss, forward or backward), Inductor's scheduler nodes: generated (C++) kernels vs extern kernels (mm, the
    SDPA op, fallbacks), each with ``get_read_buffer_sizes``/``get_write_buffer_sizes``, the kernels defined
    in the generated module, and the deltas of ``torch._inductor.metrics.generated_kernel_count`` and
    ``generated_cpp_vec_kernel_count``. ``metrics.num_bytes_accessed`` is only filled when the
    ``inductor_metrics`` log artifact is enabled at INFO (``compile_fx``: ``graph.count_bytes()`` after
    ``compile_to_module``); the script enables that logger silently, records each graph's ``count_bytes`` total
    and the counter after forward and after backward (reset at the start of each case). It sums every
    scheduler node, extern kernels included, over every graph compiled (block and loss, forward and backward).
    Caches are off (``fx_graph_cache``, the AOT autograd cache; a fresh ``TORCHINDUCTOR_CACHE_DIR``) so every
    graph is compiled, and measured, in the run.

CPU measurement, GPU questions
    * The CPU flash SDPA (``_scaled_dot_product_flash_attention_for_cpu``) is an extern kernel for Inductor, as
      the CUDA flash op is; it saves output and logsumexp (fp32, [b, heads, s]) like the CUDA op.
    * Inductor does not generate code for complex ops (ComplexRoPE's view_as_complex/mul/view_as_real become
      ATen fallbacks on any device); they show as extern nodes.
    * Generated kernels are C++/OpenMP here and Triton on GPU; the scheduler's fusion decisions (and so the
      saved tensors, which AOTAutograd's min-cut partitioner chooses before Inductor) are device-independent
      except where a lowering differs by device; kernel counts are CPU's.

Run: ``python validation/measure_compile_units.py --out tests/costmodel/data/oracle_compile_units.json``
(three to five minutes on two cores)
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import warnings

# A fresh Inductor cache directory (set before torch reads it): every graph is compiled in this run.
_CACHE_DIR = tempfile.mkdtemp(prefix="inductor-")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = _CACHE_DIR
atexit.register(shutil.rmtree, _CACHE_DIR, True)

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure_units as mu  # noqa: E402  (builders, recorder, classifier, unit summary)

GENERATED_BY = "validation/measure_compile_units.py"
SHAPES = [(64, 1), (64, 2), (128, 1), (128, 2)]  # (seq_len, micro_batch)
PRECISIONS = ("fp32", "bf16-mixed")
CHECKPOINTING = ("none", "full")
MODES = ("eager", "compiled")

# The second config: half as many key/value heads as query heads (measure_units' torchtitan config has 8/2).
KV4 = "torchtitan-llama3-h128-kv4"
mu.TORCHTITAN_ARGS.setdefault(KV4, dict(mu.TORCHTITAN_ARGS["torchtitan-llama3-h128"], n_kv_heads=4))
CONFIG_NAMES = ("torchtitan-llama3-h128", KV4)
CONFIGS = {"torchtitan-llama3-h128": dict(mu.CONFIGS["torchtitan-llama3-h128"]),
           KV4: dict(mu.CONFIGS["torchtitan-llama3-h128"], num_key_value_heads=4)}

NOT_MEASURED = [
    {"what": "checkpointing selective-op under compile",
     "why": "not in this grid (none and full only); measure_units.py measures it eager."},
    {"what": "flex attention (torchtitan's default LM backend)",
     "why": "the block keeps measure_units.py's causal SDPA so compiled and eager rows compare one to one; "
            "flex's compiled kernel is a Triton template on GPU and a C++ template on CPU."},
    {"what": "parallelize_llama's spmd_types path (model.parallelize)",
     "why": "as measure_units.py: FSDP2 via apply_fsdp_to_decoder on a 1-rank mesh, AC and compile in "
            "parallelize_llama's order."},
]


# --------------------------------------------------------------------------------------------------
# Inductor observation.
# --------------------------------------------------------------------------------------------------

class InductorObserver:
    """Wraps GraphLowering.codegen / count_bytes (observation only) and records one entry per graph."""

    def __init__(self):
        from torch._inductor import compile_fx, metrics
        from torch._inductor.graph import GraphLowering
        self.metrics = metrics
        self.graphs = []
        self.by_graph = {}
        self.frame_unit = {}   # Dynamo frame id -> "block" / "loss" (set when its forward compiles)
        self.recorder = None
        # metrics.num_bytes_accessed is filled only when this artifact logger is enabled at INFO; enable it
        # without any output.
        log = compile_fx.inductor_metrics_log
        log.setLevel(logging.INFO)
        log.propagate = False
        log.addHandler(logging.NullHandler())
        orig_codegen, orig_count = GraphLowering.codegen, GraphLowering.count_bytes
        observer = self

        def codegen(graph):
            k0, v0 = metrics.generated_kernel_count, metrics.generated_cpp_vec_kernel_count
            result = orig_codegen(graph)
            try:
                observer.record(graph, result, metrics.generated_kernel_count - k0,
                                metrics.generated_cpp_vec_kernel_count - v0)
            except Exception as e:  # pragma: no cover - reported in the output
                observer.graphs.append({"error": f"{type(e).__name__}: {e}"})
            return result

        def count_bytes(graph):
            out = orig_count(graph)
            rec = observer.by_graph.get(id(graph))
            if rec is not None:
                rec["num_bytes_accessed"] = int(out[0])
            return out

        GraphLowering.codegen = codegen
        GraphLowering.count_bytes = count_bytes

    def start_case(self, recorder):
        self.graphs, self.by_graph, self.recorder = [], {}, recorder
        self.metrics.reset()

    def record(self, graph, result, kernel_count, vec_count):
        from torch._inductor import scheduler as sch
        cid = torch._guards.CompileContext.current_compile_id()
        frame = getattr(cid, "frame_id", None)
        if not graph.is_backward:
            unit = self.recorder.unit if self.recorder is not None else "?"
            self.frame_unit[frame] = "block" if unit.startswith("block") else "loss"
        src = result[0].value if hasattr(result[0], "value") else str(result[0])
        kernel_defs = re.findall(r"^(\w+) = async_compile\.\w+\(", src, re.M)
        nodes, gen_r, gen_w, extern = [], 0, 0, {}
        for n in graph.scheduler.nodes:
            r, w = int(n.get_read_buffer_sizes()), int(n.get_write_buffer_sizes())
            if isinstance(n, sch.NopKernelSchedulerNode):
                kind, op = "nop", None
            elif isinstance(n, sch.ExternKernelSchedulerNode):
                kind = "extern"
                op = getattr(n.node, "python_kernel_name", None) or type(n.node).__name__
                if op == "None" or op is None:
                    op = type(n.node).__name__
                op = op.replace("torch.ops.", "").replace("extern_kernels.", "")
                e = extern.setdefault(op, {"count": 0, "read_bytes": 0, "write_bytes": 0})
                e["count"] += 1
                e["read_bytes"] += r
                e["write_bytes"] += w
            else:
                kind, op = "generated", None
                gen_r += r
                gen_w += w
            entry = {"kind": kind, "scheduler_node": type(n).__name__, "read_bytes": r, "write_bytes": w}
            if op is not None:
                entry["op"] = op
            else:
                entry["modules"] = sorted({p["module"] or "(graph)" for p in map(fx_provenance, node_origins(n))})
                entry["aten_ops"] = sorted({p["aten"] for p in map(fx_provenance, node_origins(n))})
            nodes.append(entry)
        rec = {
            "unit": self.frame_unit.get(frame, "?"), "pass": "backward" if graph.is_backward else "forward",
            "scheduler_nodes": len(nodes),
            "generated_kernels": len(kernel_defs),
            "generated_kernel_nodes": sum(1 for n in nodes if n["kind"] == "generated"),
            "metrics_generated_kernel_count": int(kernel_count),
            "metrics_generated_cpp_vec_kernel_count": int(vec_count),
            "generated_kernel_read_bytes": gen_r, "generated_kernel_write_bytes": gen_w,
            "extern_kernels": extern,
            "node_list": nodes,
            "_fx_outputs": list(graph.module.graph.find_nodes(op="output"))[0].args[0],
        }
        self.graphs.append(rec)
        self.by_graph[id(graph)] = rec


def node_origins(snode):
    """The FX nodes a scheduler node was lowered from."""
    out = []
    for sub in snode.get_nodes():
        out.extend(getattr(sub.node, "origins", ()) or ())
    return out


def fx_provenance(node):
    """Where an FX node of an AOT graph comes from: ATen op, module path in the block, source call."""
    meta = getattr(node, "meta", {}) or {}
    stack = meta.get("nn_module_stack") or {}
    module = None
    if stack:  # block-relative: "attention.wo"; "(block)" for the block's own forward
        module = re.sub(r"^L\['self'\]\.?", "", list(stack.values())[-1][0])
        wrapper = r"^(__dict__\['_modules'\]\['_checkpoint_wrapped_module'\]|_checkpoint_wrapped_module)\.?"
        module = re.sub(wrapper, "", module) or "(block)"
    src = meta.get("source_fn_stack") or []
    aten = meta.get("original_aten")
    return {"fx_node": node.name, "aten": str(aten) if aten is not None else str(node.target),
            "module": module, "source_fn": src[-1][0] if src else None}


# --------------------------------------------------------------------------------------------------
# Models and cases.
# --------------------------------------------------------------------------------------------------

def build_model(group, seq_len, compiled):
    """measure_units.build_torchtitan_model with apply_compile between AC and FSDP (parallelize_llama)."""
    from torchtitan.config import CompileConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.compile import apply_compile
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    if not compiled:
        return mu.build_torchtitan_model(group, seq_len)
    config = mu.torchtitan_model_config(group["config"], seq_len)
    torch.manual_seed(0)
    model = config.build()
    model.init_states(buffer_device=torch.device("cpu"))
    model.train()
    mu.apply_torchtitan_ac(model, group["checkpointing"])
    apply_compile(model, compile_config=CompileConfig(enable=True),
                  parallel_dims=ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1,
                                             world_size=1))
    mesh = mu.init_single_rank_gloo()
    param_dtype = torch.bfloat16 if group["precision"] == "bf16-mixed" else torch.float32
    apply_fsdp_to_decoder(model, mesh, param_dtype=param_dtype, reduce_dtype=torch.float32,
                          pp_enabled=False)
    return model


class CompiledBlockMarkers:
    """Sets the unit before each compiled block's call (outside the compiled region); records block inputs."""

    def __init__(self, recorder, layers):
        self.inputs = {}
        self.saved = []
        for i, layer in enumerate(layers):
            inner = layer._compiled_call_impl
            if inner is None:
                raise RuntimeError("block is not compiled")

            def call(*args, _inner=inner, _name=f"block {i}", **kwargs):
                recorder.set_unit(_name)
                if args and isinstance(args[0], torch.Tensor):
                    self.inputs[_name] = args[0].untyped_storage()._cdata
                return _inner(*args, **kwargs)
            self.saved.append((layer, inner))
            layer._compiled_call_impl = call

    def remove(self):
        for layer, inner in self.saved:
            layer._compiled_call_impl = inner


def storage_names(model):
    """Storage key -> name for FSDP2's unsharded parameters and the model's buffers (after a forward)."""
    from torch.distributed.fsdp import FSDPModule
    names = {}
    module_name = {id(m): n for n, m in model.named_modules()}
    for mod in model.modules():
        if not isinstance(mod, FSDPModule):
            continue
        group = mod._get_fsdp_state()._fsdp_param_group
        for fp in (group.fsdp_params if group is not None else []):
            if hasattr(fp, "_unsharded_param"):
                info = fp._module_info
                names[fp._unsharded_param.untyped_storage()._cdata] = (
                    module_name.get(id(info.module), "?") + "." + info.param_name)
    for n, b in model.named_buffers():
        names.setdefault(b.untyped_storage()._cdata, n)
    return names


def block_tensor_list(recorder, classifier, unit, names, block_inputs, fw_graph):
    """Every tensor packed in `unit`, in order, with its storage facts and (compiled) graph provenance."""
    seen = set()
    events = [(t, key, nb) for u, t, key, nb in recorder.events if u == unit]
    # Earlier units' storages count as already counted (e.g. the block input saved by the previous block).
    for u, t, key, nb in recorder.events:
        if u == unit:
            break
        seen.add(key)
    outs = None
    if fw_graph is not None:
        fx_outs = [o for o in fw_graph["_fx_outputs"] if hasattr(o, "meta")]
        cand = fx_outs[len(fx_outs) - len(events):] if len(events) <= len(fx_outs) else None
        if cand is not None and all(
                tuple(getattr(o.meta.get("val"), "shape", ())) == tuple(t.shape)
                for o, (t, _, _) in zip(cand, events)):
            outs = cand
    rows = []
    for i, (t, key, nb) in enumerate(events):
        row = {
            "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""), "stride": list(t.stride()),
            "tensor_bytes": int(t.numel() * t.element_size()), "storage_bytes": int(nb),
            "view_of_counted_storage": key in seen, "kind": classifier.kind(t, key),
            "grad_fn": t.grad_fn.name() if t.grad_fn is not None else None,
        }
        try:
            row["freed_before_backward"] = t.untyped_storage().nbytes() == 0 and nb > 0
        except (RuntimeError, NotImplementedError):
            row["freed_before_backward"] = False
        if key in names:
            row["name"] = names[key]
        elif block_inputs.get(unit) == key:
            row["name"] = "block input"
        if outs is not None:
            o = outs[i]
            row["graph_output"] = (fx_provenance(o) if o.op != "placeholder"
                                   else {"fx_node": o.name, "aten": "placeholder (graph input)",
                                         "module": None, "source_fn": None})
        rows.append(row)
        seen.add(key)
    return rows, outs is not None


def run_case(config, precision, ckpt, seq_len, batch, mode, detail, observer):
    compiled = mode == "compiled"
    group = dict(recipe="torchtitan", config=config, model_class="torchtitan.models.llama3.Llama3Model",
                 precision=precision, attention="flash", checkpointing=ckpt,
                 loss="fused" if compiled else "upcast")
    torch._dynamo.reset()
    model = build_model(group, seq_len, compiled)
    recorder = mu.SavedTensorRecorder()
    layers = list(model.layers.values())
    if compiled:
        markers = CompiledBlockMarkers(recorder, layers)
        handles = [model.norm.register_forward_pre_hook(lambda *_: recorder.set_unit(mu.UNIT_HEAD))]
    else:
        markers = None
        handles = mu.install_unit_markers(recorder, layers, model.norm)
    classifier = mu.StorageClassifier(model)
    loss_fn = mu.build_torchtitan_loss(group, model, recorder)
    observer.start_case(recorder)
    loss, _, _ = mu.run_torchtitan(model, loss_fn, group, seq_len, batch, recorder)
    nba_forward = int(observer.metrics.num_bytes_accessed)
    classifier.note_fsdp_unsharded(model)
    units = mu.summarise_units(recorder, classifier, len(layers), False)
    record = {k: v for k, v in group.items() if k != "model_class"}
    record.update({
        "id": mu.case_id(group, seq_len, batch) + "/" + mode, "mode": mode,
        "compile": "model+loss (apply_compile, inductor, fullgraph)" if compiled else "none",
        "seq_len": seq_len, "micro_batch": batch, "units": units,
    })
    if not compiled:
        record["oracle_units_id"] = mu.case_id(group, seq_len, batch)
    if detail:
        fw = next((g for g in observer.graphs if g.get("unit") == "block" and g["pass"] == "forward"), None)
        rows, matched = block_tensor_list(recorder, classifier, "block 0", storage_names(model),
                                          markers.inputs if markers else {}, fw)
        record["block0_saved_tensors"] = rows
        if compiled:
            record["block0_saved_tensors_match_graph_outputs"] = matched
    for h in handles:
        h.remove()
    if markers:
        markers.remove()
    loss.backward()
    if not any(p.grad is not None for p in model.parameters()):
        raise RuntimeError("backward produced no gradient")
    record["loss"] = float(loss.detach())
    if compiled:
        graphs = []
        for g in observer.graphs:
            g = {k: v for k, v in g.items() if k != "_fx_outputs"}
            if not detail:
                g.pop("node_list", None)
            graphs.append(g)
        record["graphs"] = graphs
        record["metrics_num_bytes_accessed"] = {
            "after_forward": nba_forward, "after_backward": int(observer.metrics.num_bytes_accessed)}
    return record


def check_against_oracle_units(cases, path):
    """Eager rows vs measure_units.py's corpus (printed only)."""
    if not os.path.exists(path):
        print(f"{path} absent: eager rows not compared", file=sys.stderr)
        return
    with open(path) as f:
        oracle = {c["id"]: c for c in json.load(f)["cases"]}
    same = differ = absent = 0
    for c in cases:
        if c["mode"] != "eager":
            continue
        o = oracle.get(c["oracle_units_id"])
        if o is None:
            absent += 1
            continue
        ok = all(c["units"][u][f] == o["units"][u][f] for u in c["units"] for f in mu.KIND_FIELD.values())
        same += ok
        differ += not ok
        if not ok:
            print(f"DIFFERS from oracle_units: {c['id']}", file=sys.stderr)
    print(f"eager vs oracle_units.json: {same} equal, {differ} differ, {absent} not in that corpus",
          file=sys.stderr)


def loss_agreement(cases):
    """Compiled loss against the eager loss of the same case (relative)."""
    eager = {(c["config"], c["precision"], c["checkpointing"], c["seq_len"], c["micro_batch"]): c["loss"]
             for c in cases if c["mode"] == "eager"}
    for c in cases:
        if c["mode"] == "compiled":
            ref = eager.get((c["config"], c["precision"], c["checkpointing"], c["seq_len"], c["micro_batch"]))
            if ref is not None:
                c["loss_matches_eager"] = abs(c["loss"] - ref) <= 1e-2 * max(1.0, abs(ref))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--only", default=None,
                        help="debugging: run only the cases whose id contains one of these comma-separated texts")
    args = parser.parse_args()

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    warnings.filterwarnings("ignore")
    import torch._inductor.config as inductor_config
    inductor_config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    observer = InductorObserver()
    start = time.time()

    cases, dropped = [], []
    for config in CONFIG_NAMES:
        for precision in PRECISIONS:
            for ckpt in CHECKPOINTING:
                for mode in MODES:
                    for i, (s, b) in enumerate(SHAPES):
                        cid = f"{config}/{precision}/{ckpt}/s{s}-b{b}/{mode}"
                        if args.only and not any(t in cid for t in args.only.split(",")):
                            continue
                        t0 = time.time()
                        try:
                            cases.append(run_case(config, precision, ckpt, s, b, mode, i == 0, observer))
                        except Exception as e:
                            dropped.append({"case": cid, "error": f"{type(e).__name__}: {e}"})
                            print(f"DROPPED {cid}: {type(e).__name__}: {e}", file=sys.stderr)
                            continue
                        blk = cases[-1]["units"]["block 0"]
                        print(f"{cid}: block activation {blk['activation_bytes']}, {time.time() - t0:.1f} s",
                              file=sys.stderr)
    loss_agreement(cases)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    check_against_oracle_units(cases, os.path.join(root, "tests/costmodel/data/oracle_units.json"))
    for c in cases:
        c.pop("loss")  # float bits of the loss are not part of the corpus (agreement is)

    out = {
        "schema_version": 1,
        "generated_by": GENERATED_BY,
        "command": "python validation/measure_compile_units.py --out " + mu.repo_relative(args.out)
                   + (f" --only {args.only}" if args.only else ""),
        "versions": mu.versions(),
        "configs": CONFIGS,
        "torchtitan_args": {k: mu.TORCHTITAN_ARGS[k] for k in CONFIG_NAMES},
        "shapes": [{"seq_len": s, "micro_batch": b} for s, b in SHAPES],
        "torch_threads": torch.get_num_threads(),
        "compile_recipe": {
            "function": "torchtitan.distributed.compile.apply_compile",
            "called_from": "torchtitan.models.llama3.parallelize.parallelize_llama: after activation "
                           "checkpointing, before apply_fsdp_to_decoder",
            "per_block": "transformer_block.compile(backend=compile_config.backend ('inductor'), "
                         "fullgraph=True) for every child of model.layers (the CheckpointWrapper under FullAC)",
            "globals": {"torch._dynamo.config.capture_scalar_outputs": True,
                        "torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint": True},
            "loss": "CompileConfig.components defaults to ['model', 'loss']: CrossEntropyLoss compiled too",
        },
        "cases": cases,
        "dropped": dropped,
        "not_measured": NOT_MEASURED,
    }
    mu.write_corpus_json(args.out, out, f"{len(cases)} cases, {len(dropped)} dropped", start)


if __name__ == "__main__":
    main()
