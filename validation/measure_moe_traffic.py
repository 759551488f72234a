#!/usr/bin/env python3
"""Measure the bytes moved by the memory-bound ops of transformers' mixture-of-experts training steps.

What it measures
----------------
validation/measure_traffic.py's record (imported and run as it is: its dispatch mode, byte rule, unit
markers and ``measure``) for the four MoE causal LMs of validation/measure_moe_units.py, built by
measure_units' ``build_hf_model`` from the configs measure_moe_units registers (hidden 64, 4 heads over 2
key/value heads of 16, 2 layers, vocab 128, 8 experts, top-2, expert width 32; Qwen2-MoE's shared expert
of width 48): ``MixtralForCausalLM``, ``Qwen2MoeForCausalLM``, ``Qwen3MoeForCausalLM``, ``OlmoeForCausalLM``,
on transformers' default experts path (``config._experts_implementation``, resolved at build time and
recorded per case as ``experts_implementation``: "grouped_mm"). Grid: precision fp32 and bf16-mixed
(``torch.autocast("cpu", dtype=torch.bfloat16)`` around forward and loss, parameters fp32, as
measure_traffic does) x checkpointing none and full (``use_reentrant=False``) x attention "flash" (sdpa)
x shape (seq 128/256 x micro-batch 1/2).

Classes. measure_traffic's ``op_class`` does not list the grouped GEMM: ``aten::_grouped_mm`` (what
``torch.nn.functional.grouped_mm`` dispatches, forward and, through ``GroupedMmBackward0``, backward)
would fall to its default class, memory-bound. This script replaces the module's ``op_class`` for its
run (measure_traffic.py itself is not changed) with one that puts the names in ``MOE_GEMM_OPS`` in
class ``gemm``, and keeps every other answer. The top-level ``classifier`` says what that changed
(``reclassified``: op name, class before and after, how many calls) and which ops reached the
memory-bound class only through the fall-through default although measure_traffic's dense corpus
(tests/costmodel/data/oracle_traffic.json, ``memory_bound_ops`` of all its cases) never saw them
(``ops_not_in_dense_corpus``), with their call counts over the whole run.

What each case adds to measure_traffic's record
-----------------------------------------------
* ``id``: measure_moe_units' case id (the experts implementation before the shape).
* ``experts_implementation``, ``attn_implementation`` (read from the model's config at run time),
  ``gemm_ops`` (calls per GEMM op name over the step).
* ``op_breakdown``: for block 1, forward (with the model's loss, as measure_traffic's phases) and
  backward (with the recompute of a checkpointed block) apart, its memory-bound ops aggregated by ATen
  op name: ``{"op", "count", "bytes", "modules": [...]}``; each module entry is the decoder layer's
  submodule the op ran in (``module``: its path relative to the layer, "" for the layer's own code such
  as the residual adds; ``part``: measure_moe_units' ``part_of`` grouping: attention, norms, router,
  experts, shared_expert, mlp, layer) with its count and bytes and ``instances``: the calls grouped by
  signature (tensor inputs -> tensor outputs, as dtype[shape]; in backward also ``node``, the autograd
  node executing) with count and bytes each, so each step of the experts' dispatch can be read off.
  The bytes are those measure_traffic's mode added for the call (the difference of its running total).
* ``op_breakdown_check``: per phase, the breakdown's bytes and calls against the unit's memory-bound
  totals (equal when every memory-bound call of the block was attributed).

How a call finds its module. Forward: forward pre-hooks and hooks on each decoder layer and every
submodule keep a stack of the modules running; the innermost names the call. Backward: the autograd node
the engine is running (``torch._C._current_autograd_node()``) is looked up by its sequence number, which
the forward mapped to the module running when the node was made (the numbers the autograd counter
handed out since the previous call reached the mode go to the call now reaching it: autograd makes an
op's node, and for some in-place ops the clone it saves, before it dispatches the op). ``AccumulateGrad``
goes to the module owning its parameter; a call with no node running is ``(engine)``. Checkpointing's
recompute (forward code that backward runs, told apart by grad mode being on: the engine runs nodes with
it off) uses the forward stack, and its calls' ``node`` starts with "(recompute)"; its early stop leaves
the stack unpopped, so a layer's pre-hook clears it. The engine sums the gradients of a tensor used
twice while the node producing the later one runs, so that ``add`` goes to that node's module.

Reading the bytes. They follow measure_traffic's rule unchanged: every tensor input is read whole (a
gather's source too, not only the rows it picks) and an op given a tensor only as a template
(``new_zeros``, which CPU's index backward calls before its accumulating ``index_put``) still counts it
as read.

Top level as in oracle_traffic.json (schema_version, generated_by, command, versions, configs, cases,
dropped), plus ``shapes``, ``torch_threads``, ``classifier`` and ``seconds`` (the run's wall time).
Each ``instances`` entry is written on one line.

Run with the python of the frameworks venv that scripts/frameworks-env.sh makes (build/frameworks):
``python validation/measure_moe_traffic.py --out tests/costmodel/data/oracle_moe_traffic.json``
(about ten seconds on two cores).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
import warnings

import torch
from torch.utils._pytree import tree_flatten

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure_traffic as mt  # noqa: E402  (the dispatch mode, byte rule and case runner)
import measure_moe_units as mmu  # noqa: E402  (registers the MoE configs in measure_units.CONFIGS)

mu = mt.mu
GENERATED_BY = "validation/measure_moe_traffic.py"
SHAPES = [(128, 1), (128, 2), (256, 1), (256, 2)]  # (seq_len, micro_batch)
MOE_GEMM_OPS = {"_grouped_mm", "grouped_mm", "_grouped_mm_backward", "_scaled_grouped_mm"}
BREAKDOWN_UNITS = ("block 1",)
DENSE_CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "tests", "costmodel", "data", "oracle_traffic.json")

ORIGINAL_OP_CLASS = mt.op_class
ORIGINAL_INSTALL_BACKWARD_MARKERS = mt.install_backward_markers
RECLASSIFIED = {}   # op name -> {"from", "to", "calls"}
DEFAULTED = {}      # op name -> calls, for ops measure_traffic classes memory-bound by its default only


def op_name(func):
    return func.__name__.split(".")[0]


def classify(func):
    """measure_traffic's op_class with the grouped GEMMs as gemm."""
    return "gemm" if op_name(func) in MOE_GEMM_OPS else ORIGINAL_OP_CLASS(func)


def moe_op_class(func):
    """classify, noting what it changed and what reached memory-bound by default (the op_class that
    measure_traffic's mode calls, once per dispatched op)."""
    before = ORIGINAL_OP_CLASS(func)
    name = op_name(func)
    after = classify(func)
    if after != before:
        entry = RECLASSIFIED.setdefault(name, {"from": before, "to": after, "calls": 0})
        entry["calls"] += 1
    elif after == "memory_bound":
        DEFAULTED[name] = DEFAULTED.get(name, 0) + 1
    return after


def short_dtype(dtype):
    return {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.int64: "i64",
            torch.int32: "i32", torch.bool: "b1", torch.float64: "f64"}.get(dtype, str(dtype))


def describe(tensors):
    return ", ".join(f"{short_dtype(t.dtype)}[{','.join(str(d) for d in t.shape)}]" for t in tensors)


class MoeTrafficMode(mt.TrafficMode):
    """measure_traffic's mode (its bytes, counts and units unchanged) that also notes, for the memory-bound
    calls of BREAKDOWN_UNITS, the op, the submodule and the signature, with the bytes the mode added."""

    last = None

    def __init__(self):
        super().__init__()
        MoeTrafficMode.last = self
        self.stack = []          # forward: submodule paths of the current decoder layer, innermost last
        self.node_module = {}    # forward autograd node sequence nr -> (unit, module path)
        self.next_seq = torch._C._autograd._get_sequence_nr()  # the first node number not yet mapped
        self.param_module = {}   # id(parameter) -> module path
        self.breakdown = {}      # (unit, phase, op, module, signature, node) -> [calls, bytes]
        self.gemm_ops = {}
        self.experts_implementation = None
        self.attn_implementation = None

    def recomputing(self):
        """Checkpointing's recompute: forward code run by backward, with grad mode on (the engine runs the
        nodes with it off)."""
        return self.phase == "backward" and torch.is_grad_enabled()

    def current_module(self):
        if self.phase == "forward" or self.recomputing():
            return self.stack[-1] if self.stack else ""
        node = torch._C._current_autograd_node()
        if node is None:
            return "(engine)"
        if node.name() == "torch::autograd::AccumulateGrad":
            return self.param_module.get(id(node.variable), "(parameter outside the layers)")
        return self.node_module.get(node._sequence_nr(), (None, "(unmapped)"))[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.phase == "forward":
            # The nodes made since the last op reached this mode are this op's (autograd makes an op's
            # node, and for an in-place op the clone it saves, before dispatching the op).
            seq = torch._C._autograd._get_sequence_nr()
            for n in range(self.next_seq, seq):
                self.node_module.setdefault(n, (self.unit, self.stack[-1] if self.stack else ""))
            self.next_seq = max(self.next_seq, seq)
        cls = classify(func)
        key = (self.unit, self.phase, cls)
        before = self.totals.get(key, [0, 0])[0]
        out = super().__torch_dispatch__(func, types, args, kwargs)
        name = op_name(func)
        if cls == "gemm":
            self.gemm_ops[name] = self.gemm_ops.get(name, 0) + 1
        if cls == "memory_bound" and self.unit in BREAKDOWN_UNITS:
            moved = self.totals[key][0] - before
            ins = [t for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            signature = f"({describe(ins)}) -> ({describe(outs)})"
            node = ""
            if self.phase == "backward":
                running = torch._C._current_autograd_node()
                node = running.name() if running is not None else ""
                if self.recomputing():
                    node = "(recompute) " + node
            bkey = (self.unit, self.phase, name, self.current_module(), signature, node)
            entry = self.breakdown.setdefault(bkey, [0, 0])
            entry[0] += 1
            entry[1] += moved
        return out


def install_module_tracking(mode, layers):
    """Forward pre-hooks push a decoder layer's submodule path ("" for the layer), forward hooks pop it
    (both return None, so the modules' inputs and outputs are untouched); also maps each layer parameter
    to its module."""
    def enter(name):
        def hook(*_):
            if name == "":  # a layer starts: drop what a recompute stopped early left on the stack
                mode.stack.clear()
            mode.stack.append(name)
        return hook

    def leave(name):
        def hook(*_):
            if mode.stack and mode.stack[-1] == name:
                mode.stack.pop()
        return hook

    handles = []
    for layer in layers:
        for name, sub in layer.named_modules():  # the layer itself is "" (its own code)
            for p in sub.parameters(recurse=False):
                mode.param_module[id(p)] = name
            handles.append(sub.register_forward_pre_hook(enter(name)))
            handles.append(sub.register_forward_hook(leave(name)))
    return handles


def install_markers_and_tracking(mode, layers, final_norm, embedding):
    """measure_traffic's backward markers, plus the module tracking and the implementations in use."""
    handles = ORIGINAL_INSTALL_BACKWARD_MARKERS(mode, layers, final_norm, embedding)
    if isinstance(mode, MoeTrafficMode):
        handles += install_module_tracking(mode, layers)
        cfg = getattr(getattr(layers[-1].mlp, "experts", None), "config", None)
        mode.experts_implementation = getattr(cfg, "_experts_implementation", None)
        mode.attn_implementation = getattr(layers[-1].self_attn.config, "_attn_implementation", None)
    return handles


@contextlib.contextmanager
def patched_measure_traffic():
    """measure_traffic's module-level names pointed at this script's classifier, mode and markers for the
    run, and restored after."""
    saved = (mt.op_class, mt.TrafficMode, mt.install_backward_markers)
    mt.op_class, mt.TrafficMode, mt.install_backward_markers = (
        moe_op_class, MoeTrafficMode, install_markers_and_tracking)
    try:
        yield
    finally:
        mt.op_class, mt.TrafficMode, mt.install_backward_markers = saved


def breakdown_record(mode, unit_totals):
    """Per unit and phase, the ops aggregated by name, each split by module and by signature."""
    out, checks = {}, {}
    for (unit, phase, name, module, signature, node), (calls, moved) in mode.breakdown.items():
        ops = out.setdefault(unit, {}).setdefault(phase, {})
        op = ops.setdefault(name, {"op": name, "count": 0, "bytes": 0, "modules": {}})
        op["count"] += calls
        op["bytes"] += moved
        mod = op["modules"].setdefault(module, {"module": module, "part": part(module), "count": 0,
                                                "bytes": 0, "instances": []})
        mod["count"] += calls
        mod["bytes"] += moved
        inst = {"signature": signature, "count": calls, "bytes": moved}
        if phase == "backward":
            inst["node"] = node
        mod["instances"].append(inst)
    for unit, phases in out.items():
        for phase, ops in phases.items():
            listed = []
            for name in sorted(ops):
                op = ops[name]
                op["modules"] = [op["modules"][m] for m in sorted(op["modules"])]
                for m in op["modules"]:
                    m["instances"].sort(key=lambda i: (-i["bytes"], i["signature"], i.get("node", "")))
                listed.append(op)
            phases[phase] = listed
            total = unit_totals.get(unit, {}).get(phase, {}).get("memory_bound", {"bytes": 0, "ops": 0})
            got_b = sum(o["bytes"] for o in listed)
            got_n = sum(o["count"] for o in listed)
            checks.setdefault(unit, {})[phase] = {
                "breakdown_bytes": got_b, "breakdown_calls": got_n, "unit_memory_bound_bytes": total["bytes"],
                "unit_memory_bound_ops": total["ops"],
                "equal": got_b == total["bytes"] and got_n == total["ops"]}
    return out, checks


def part(module):
    """measure_moe_units' grouping of a layer's submodules ("(engine)" and the like kept as they are)."""
    return module if module.startswith("(") else mmu.part_of(module)


def case_plan():
    groups = []
    for config, cls in mmu.MODELS:
        for precision in ("fp32", "bf16-mixed"):
            for ckpt in ("none", "full"):
                groups.append(dict(recipe="hf", config=config, model_class=cls, precision=precision,
                                   attention="flash", checkpointing=ckpt, loss="upcast"))
    return groups


def measure(group, seq_len, batch):
    record = mt.measure(group, seq_len, batch)
    mode = MoeTrafficMode.last
    impl = mode.experts_implementation
    record["id"] = mmu.case_id(group, impl, seq_len, batch)
    record["experts_implementation"] = impl
    record["attn_implementation"] = mode.attn_implementation
    record["gemm_ops"] = dict(sorted(mode.gemm_ops.items()))
    record["op_breakdown"], record["op_breakdown_check"] = breakdown_record(mode, record["units"])
    return record


def dense_corpus_ops():
    try:
        with open(DENSE_CORPUS) as f:
            cases = json.load(f)["cases"]
    except (OSError, ValueError, KeyError):
        return None
    return sorted({name for c in cases for name in c.get("memory_bound_ops", {})})


def write_json(path, out):
    """Sorted keys, one space of indent (measure_traffic's layout), each ``instances`` entry on one line."""
    lines = {}
    for c in out["cases"]:
        for phases in c["op_breakdown"].values():
            for ops in phases.values():
                for op in ops:
                    for m in op["modules"]:
                        for i, inst in enumerate(m["instances"]):
                            marker = f"@@inst{len(lines)}@@"
                            lines[marker] = json.dumps(inst, sort_keys=True)
                            m["instances"][i] = marker
    text = json.dumps(out, indent=1, sort_keys=True)
    text = re.sub(r'"(@@inst\d+@@)"', lambda m: lines[m.group(1)], text)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default=None,
                        help="debugging: run only the case groups whose id contains one of these "
                             "comma-separated texts")
    args = parser.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    warnings.filterwarnings("ignore")
    start = time.time()
    cases, dropped = [], []
    with patched_measure_traffic():
        for group in case_plan():
            gid = mu.case_id(group, 0, 0)
            if args.only and not any(t in gid for t in args.only.split(",")):
                continue
            for seq_len, batch in SHAPES:
                try:
                    cases.append(measure(group, seq_len, batch))
                except Exception as e:  # a framework that cannot run the case is reported, not hidden
                    dropped.append({"group": group, "error": f"{type(e).__name__}: {e}"})
                    print(f"DROPPED {group}: {type(e).__name__}: {e}", file=sys.stderr)
                    break
                print(cases[-1]["id"], file=sys.stderr)
    dense = dense_corpus_ops()
    out = {
        "schema_version": 1,
        "generated_by": GENERATED_BY,
        "command": "python validation/measure_moe_traffic.py --out " + mu.repo_relative(args.out)
                   + (f" --only {args.only}" if args.only else ""),
        "versions": mu.versions(),
        "configs": {name: dict(cfg) for name, cfg in mmu.CONFIGS.items()},
        "shapes": [{"seq_len": s, "micro_batch": b} for s, b in SHAPES],
        "torch_threads": torch.get_num_threads(),
        "classifier": {
            "gemm_ops_added": sorted(MOE_GEMM_OPS),
            "reclassified": dict(sorted(RECLASSIFIED.items())),
            "dense_corpus": mu.repo_relative(DENSE_CORPUS),
            "ops_not_in_dense_corpus": (None if dense is None else
                                        {n: c for n, c in sorted(DEFAULTED.items()) if n not in dense}),
        },
        "cases": cases,
        "dropped": dropped,
        "seconds": round(time.time() - start, 1),
    }
    write_json(args.out, out)
    print(f"{len(cases)} cases, {len(dropped)} dropped, {time.time() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
