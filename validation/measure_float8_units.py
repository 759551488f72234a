#!/usr/bin/env python3
# Over 800 lines: one corpus, one command: the grid of Float8 settings, the probes of what runs
# on a CPU and the writer stay in the one script that regenerates the corpus.
"""Measure what torchtitan's Llama block keeps for backward under torchao's Float8 training, and what FSDP2
all-gathers for it.

What it measures
    torchtitan 0.3.0's ``Llama3Model`` (the torchtitan-llama3-h128 config of validation/measure_units.py:
    fused wqkv 128 -> 192, wo 128 -> 128, w1/w3 128 -> 352, w2 352 -> 128, 8 heads over 2 key/value heads,
    causal SDPA, ComplexRoPE, lm_head 128 -> 1000) built and parallelized as measure_compile_units.py does it
    (bf16-mixed: FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` through
    ``apply_fsdp_to_decoder`` on a 1-rank gloo mesh, no autocast; activation checkpointing, then
    ``apply_compile``, then FSDP2, in ``parallelize_llama``'s order), with float8 applied as torchtitan 0.3.0
    applies it: ``torchtitan.components.quantization.Float8LinearConverter`` (``--model.converters float8``)
    converts the model *config* before the build (``model_registry(..., converters=[...])``:
    ``convert(model_config)`` swaps every ``Linear.Config`` its filter accepts for ``Float8Linear.Config``,
    torchtitan's subclass of torchao's ``torchao.float8.float8_linear.Float8Linear``, built with
    ``Float8LinearConfig.from_recipe_name(recipe_name)``).

    What torchtitan 0.3.0's converter offers (its ``Float8LinearConverter.Config``), and so the grid:
    * ``recipe_name``: ``"rowwise"`` (its default) or ``"rowwise_with_gw_hp"``; torchao's ``"tensorwise"``
      (torchao's default recipe) is outside the field's ``Literal`` but the converter passes it through to
      ``from_recipe_name`` unchanged, so it is measured too.
    * ``filter_fqns``: ``["lm_head"]`` as torchtitan's ``llama3_405b`` config sets it (the output layer is
      ``lm_head`` in 0.3.0). ``module_filter_fn`` (components/quantization/utils.py) also skips any linear
      with a dimension not divisible by 16: lm_head's 1000 outputs already are. An entry
      ``"auto_filter_small_kn"`` makes the converter use torchao's ``_auto_filter_for_recipe``; the script
      records which linears each filter accepts (``meta.linear_filters``) and runs one case with it.
    * ``emulate``: torchtitan's own way to run float8 without an SM89 GPU, eager only; the converter then
      replaces the recipe's config by ``Float8LinearConfig(emulate=True)`` (tensorwise; torchao's
      ``float8_mm`` multiplies the dequantized float8 operands in fp32). One case measures it.
    * The converter refuses to run unless ``has_cuda_capability(8, 9)`` (or emulate without compile). On
      this CPU the script replaces that check, and only it, by ``True`` while the converter is built, so
      the recipe's own config is used and its GEMMs run through ``torch._scaled_mm`` (next section).
    * torchtitan 0.3.0 has no ``enable_fsdp_float8_all_gather`` and no
      ``precompute_float8_dynamic_scale_for_fsdp`` (neither its float8 converter nor its trainer or
      ``parallelize_llama`` mention them), and its ``Float8Linear`` is built by ``__init__``, not by
      torchao's ``Float8Linear.from_float``, which is where torchao wraps the weight in
      ``WeightWithDynamicFloat8CastTensor`` (what FSDP2's float8 all-gather needs). The "tensorwise +
      float8 all-gather" cases therefore use torchao's own entry point on the built torchtitan model,
      ``torchao.float8.convert_to_float8_training(model, config=Float8LinearConfig(
      enable_fsdp_float8_all_gather=True), module_filter_fn=<torchtitan's module_filter_fn with
      ["lm_head"]>)`` (how torchtitan's float8 component applied it before the config converters), and,
      where ``precompute`` is on, ``torchao.float8.precompute_float8_dynamic_scale_for_fsdp(model)`` before
      the forward (after the optimizer step, as torchao's docs place it). The same route with
      ``enable_fsdp_float8_all_gather=False`` is one case, to show the route itself changes nothing.

    Grid (bf16-mixed): float8 none (the bf16 block; must equal oracle_units.json and
    oracle_compile_units.json where they have the case), tensorwise, rowwise, tensorwise + float8
    all-gather; checkpointing none, full, selective-op (torchtitan's SelectiveAC with measure_units.py's
    CPU flash op); eager at seq 64/128 x micro-batch 1/2 (full checkpointing, and the float8 all-gather's
    checkpointed cases, at seq 64 b1 and seq 128 b2: CPU float8 GEMMs are slow eager), compiled
    (``apply_compile``: every block ``.compile(backend="inductor", fullgraph=True)``) at seq 64 b1 and
    seq 128 b2 for checkpointing none and selective-op, seq 64 b1 for full; bf16 compiled at seq 64 b1
    (none) and at both shapes (selective-op); one case each of rowwise_with_gw_hp, emulate, the auto filter, torchao's route without
    the float8 all-gather, and the float8 all-gather with precomputed scales. The loss is torchtitan's
    ``CrossEntropyLoss`` in every case, eager ("upcast"): ``CompileConfig``'s default also compiles it,
    which changes the head only. Each case names the bf16 rows it compares with (``bf16_reference``) and
    its block 0's difference from this corpus's bf16 row, or oracle_compile_units.json's for compiled
    cases (``bf16_delta_block0``).

How it measures
    Saved tensors: measure_units.py's ``SavedTensorRecorder``, ``StorageClassifier`` and
    ``summarise_units`` (each storage once, in the first unit that saved it), extended here only where
    float8 needs it: a saved tensor that is a traceable tensor subclass (torchao's ``Float8TrainingTensor``,
    whose outer dtype is its original dtype) is recorded as its inner tensors (``__tensor_flatten__``:
    ``_data`` float8 and ``_scale`` fp32), each with its own storage; FSDP2's unsharded float8 parameters
    (``Float8TrainingTensor``) and the weight wrappers (``WeightWithDynamicFloat8CastTensor``) are known to
    the classifier by their inner storages. Unit markers, the compiled block's markers (a wrapper around
    ``_compiled_call_impl``), the per-tensor list (``block0_saved_tensors``: shape, dtype, stride, bytes,
    storage bytes, view of an already-counted storage, class, and for compiled blocks the forward-graph
    output each tensor is, with its module) and the Inductor observation come from
    measure_compile_units.py. Eager blocks' tensors are attributed to the innermost submodule whose
    forward was running (``module``; forward pre-/post-hooks on block 0's submodules), so each linear's
    saved input and weight can be told apart. A compiled block's saved output computed from its
    parameters alone (no path from the block's activation input or the RoPE cache in the forward graph:
    a weight's amax, scale, or a transposed float8 copy of a weight) is classed ``weight_copy``
    (``computed_from_parameters_only`` in the list); eager, torchao casts weights inside its autograd
    function and saves none of them, except the amaxes selective-op's save list keeps (2 bytes each,
    class activation).

    FSDP2 all-gather: on one rank FSDP2 skips the collective (``FSDPParamGroup.unshard`` copies each
    parameter's ``FSDPParam.all_gather_inputs`` into its all-gather output directly), so the script wraps
    the ``all_gather_inputs`` property (observation only) and records, per FSDP unit and pass (forward,
    backward), what each parameter contributes to the all-gather (dtype, elements, bytes: a 1-rank shard
    is the whole parameter) and the metadata torchao's ``fsdp_pre_all_gather`` returns with it (the fp32
    scale), and counts torchao's amax all-reduces (``torchao.float8.float8_utils.all_reduce``, called by
    ``tensor_to_amax(reduce_amax=True)`` when no scale was precomputed). The flat buffer's dtype is what
    FSDP2's own ``_get_all_gather_input_metadatas`` picks (uint8 as soon as two dtypes mix). After the
    backward, FSDP2's own multi-rank path, ``foreach_all_gather`` (copy-in, then
    ``dist.all_gather_single``), is called once per unit on the 1-rank gloo group (``all_gather_probe``:
    its buffer's dtype and bytes, or the error), and gloo's ``all_gather_into_tensor`` is tried on each
    float8 dtype and uint8 (``meta.gloo_dtype_probe``).

CPU measurement, GPU questions
    * torch 2.15's CPU ``torch._scaled_mm`` takes float8_e4m3fn/e5m2 operands with tensorwise (0-d) and
      rowwise ([M, 1] x [1, N]) fp32 scales (``meta.scaled_mm_cpu_probe`` checks it against a dequantized
      matmul), eager and under Inductor: every case runs torchao's kernels natively, no reference GEMM is
      substituted. The saved tensors are decided by torchao's autograd function
      (``matmul_with_hp_or_float8_args``) eager, and by AOTAutograd's min-cut partition compiled, neither
      of which depends on the GEMM kernel; the partition's choices can depend on the device's lowering.
    * The rowwise recipe sets ``torch._inductor.config.emulate_precision_casts = True`` (torchtitan's
      converter, a process-wide flag); it is restored after each case.
    * On one rank FSDP2 does not call the collective; the bytes recorded are each rank's all-gather
      input (the shard); a world of N gathers N times as many into the output. The amax all-reduces of
      the float8 all-gather are issued on the 1-rank group (counted); precompute's single all-reduce is a
      DTensor redistribution that a 1-rank mesh does not issue.
    * The CPU flash SDPA op stands in for the CUDA one (measure_units.py adds it to SelectiveAC's save list).

Run: ``python validation/measure_float8_units.py --out tests/costmodel/data/oracle_float8_units.json``
(in validation/.venv-float8, from validation/requirements-float8.txt; about eight minutes on two cores:
CPU float8 GEMMs eager, Inductor compiling)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# measure_compile_units sets a fresh Inductor cache directory before torch is imported: every graph is
# compiled in this run.
import measure_compile_units as mcu  # noqa: E402  (compiled-block markers, tensor list, Inductor observer)
import measure_units as mu  # noqa: E402  (builders, recorder, classifier, unit summary)

import torch  # noqa: E402
from torch.utils._python_dispatch import is_traceable_wrapper_subclass  # noqa: E402

GENERATED_BY = "validation/measure_float8_units.py"
CONFIG = "torchtitan-llama3-h128"
EAGER_SHAPES = [(64, 1), (64, 2), (128, 1), (128, 2)]  # (seq_len, micro_batch)
COMPILED_SHAPES = [(64, 1), (128, 2)]
FLOAT8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)

# Float8 settings: recipe (None: no float8), how it is applied, FSDP float8 all-gather, precompute.
FLOAT8 = {
    "none": dict(recipe=None),
    "tensorwise": dict(recipe="tensorwise", via="converter"),
    "rowwise": dict(recipe="rowwise", via="converter"),
    "rowwise_with_gw_hp": dict(recipe="rowwise_with_gw_hp", via="converter"),
    "tensorwise-emulate": dict(recipe="tensorwise", via="converter", emulate=True),
    "tensorwise-auto-filter": dict(recipe="tensorwise", via="converter", auto_filter=True),
    "tensorwise-torchao": dict(recipe="tensorwise", via="torchao", fsdp_float8_all_gather=False),
    "tensorwise-fp8-all-gather": dict(recipe="tensorwise", via="torchao", fsdp_float8_all_gather=True),
    "tensorwise-fp8-all-gather-precompute": dict(recipe="tensorwise", via="torchao",
                                                 fsdp_float8_all_gather=True, precompute=True),
}


def case_plan():
    """(float8, checkpointing, mode, shapes) groups in a fixed order. CPU float8 GEMMs are slow eager: full
    checkpointing (the block keeps its input) and the float8 all-gather's selective-op run two shapes."""
    plan = []
    for f8 in ("none", "tensorwise", "rowwise", "tensorwise-fp8-all-gather"):
        for ckpt in ("none", "full", "selective-op"):
            two = f8 != "none" and (ckpt == "full" or f8 == "tensorwise-fp8-all-gather" and ckpt != "none")
            plan.append((f8, ckpt, "eager", COMPILED_SHAPES if two else EAGER_SHAPES))
    plan += [("rowwise_with_gw_hp", "none", "eager", EAGER_SHAPES[:1]),
             ("tensorwise-emulate", "none", "eager", EAGER_SHAPES[:1]),
             ("tensorwise-auto-filter", "none", "eager", EAGER_SHAPES[:1]),
             ("tensorwise-torchao", "none", "eager", EAGER_SHAPES[:1]),
             ("tensorwise-fp8-all-gather-precompute", "none", "eager", EAGER_SHAPES[:1])]
    plan += [("none", "none", "compiled", COMPILED_SHAPES[:1]),
             ("none", "selective-op", "compiled", COMPILED_SHAPES)]
    for f8 in ("tensorwise", "rowwise"):
        plan.append((f8, "none", "compiled", COMPILED_SHAPES))
        plan.append((f8, "full", "compiled", COMPILED_SHAPES[:1]))
        plan.append((f8, "selective-op", "compiled", COMPILED_SHAPES))
    plan.append(("tensorwise-fp8-all-gather", "none", "compiled", COMPILED_SHAPES[:1]))
    return plan


NOT_MEASURED = [
    {"what": "enable_fsdp_float8_all_gather / precompute_float8_dynamic_scale_for_fsdp as torchtitan fields",
     "why": "torchtitan 0.3.0's Float8LinearConverter.Config has recipe_name, filter_fqns, emulate and "
            "model_compile_enabled only, and its Float8Linear is built by __init__ (no weight wrapper); the "
            "float8 all-gather is measured through torchao's convert_to_float8_training on the built model."},
    {"what": "a GPU's _scaled_mm and Inductor's Triton float8 kernels",
     "why": "CPU run: torch's CPU _scaled_mm and Inductor's C++ backend. What is saved is chosen before the "
            "kernel (torchao's autograd function eager, AOTAutograd's partition compiled)."},
    {"what": "compiled bf16 blocks at every shape, and under full checkpointing",
     "why": "in oracle_compile_units.json (same builders); each compiled case names its bf16 row there. "
            "This corpus has the compiled bf16 block at seq 64, micro-batch 1, with checkpointing none "
            "(it must equal that corpus's row) and selective-op (that corpus has none)."},
    {"what": "more than one rank",
     "why": "FSDP2 skips the all-gather on one rank; the recorded all-gather inputs are one rank's shard "
            "and foreach_all_gather is called once per unit on the 1-rank group to check the buffer."},
]


# --------------------------------------------------------------------------------------------------
# Recording: float8 tensor subclasses as their inner tensors; module attribution for eager blocks.
# --------------------------------------------------------------------------------------------------

def inner_tensors(t):
    """[(attribute path, plain tensor)] of a traceable wrapper subclass, recursively; [] for a plain one."""
    if not is_traceable_wrapper_subclass(t):
        return []
    out = []
    attrs, _ = t.__tensor_flatten__()
    for a in attrs:
        inner = getattr(t, a)
        sub = inner_tensors(inner)
        out.extend((f"{a}.{p}", x) for p, x in sub) if sub else out.append((a, inner))
    return out


class Float8Recorder(mu.SavedTensorRecorder):
    """measure_units' recorder; a saved tensor subclass is recorded as its inner tensors (each storage)."""

    def __init__(self):
        super().__init__()
        self.module = None   # innermost block submodule running (eager, set by ModuleLabels)
        self.extra = []      # per event: {"module", "subclass", "inner"}

    def pack(self, t):
        parts = inner_tensors(t)
        if not parts:
            self.extra.append({"module": self.module})
            return super().pack(t)
        self.keep.append(t)
        for attr, inner in parts:
            super().pack(inner)
            self.extra.append({"module": self.module, "subclass": type(t).__name__, "inner": attr,
                               "outer_shape": list(t.shape),
                               "outer_dtype": str(t.dtype).replace("torch.", "")})
        return t


class ModuleLabels:
    """Forward pre-/post-hooks on a block's submodules: the recorder knows the innermost one running."""

    def __init__(self, recorder, block):
        self.handles, stack = [], []
        for name, mod in block.named_modules():
            if not name:
                continue
            name = name.replace("_checkpoint_wrapped_module.", "")

            def pre(*_, _n=name):
                stack.append(_n)
                recorder.module = _n

            def post(*_):
                stack.pop()
                recorder.module = stack[-1] if stack else None
            self.handles.append(mod.register_forward_pre_hook(pre))
            self.handles.append(mod.register_forward_hook(post))

    def remove(self):
        for h in self.handles:
            h.remove()


def storage_key(t):
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


class Float8StorageClassifier(mu.StorageClassifier):
    """measure_units' classifier, knowing the inner storages of float8 parameters and weight wrappers."""

    def __init__(self, model):
        super().__init__(model)
        # A wrapper subclass's untyped_storage() is a temporary whose address a later storage can take:
        # the parameter storages are the plain tensors' own and the wrappers' inner ones.
        self.param_storages = set()
        for p in model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            parts = [inner for _, inner in inner_tensors(local)] or [local]
            self.param_storages.update(storage_key(t) for t in parts)

    weight_cast_storages = frozenset()  # compiled: saved graph outputs computed from parameters only

    def kind(self, t, key):
        if key in self.weight_cast_storages:
            return "weight_copy"
        return super().kind(t, key)

    def note_fsdp_unsharded(self, model):
        super().note_fsdp_unsharded(model)
        for fp in fsdp_params(model):
            if hasattr(fp, "_unsharded_param"):
                for _, inner in inner_tensors(fp._unsharded_param):
                    self.fsdp_storages.add(storage_key(inner))


def parameter_only_outputs(fw_graph):
    """Names of a compiled block's forward-graph outputs computed from its parameters alone: no
    placeholder they depend on is the block's activation input (the only input of 3 or more dims) or the
    complex RoPE cache. Such a saved output is a weight's cast, transpose or scale (class weight_copy)."""
    memo = {}

    def placeholders(node):
        if node.name not in memo:
            if node.op == "placeholder":
                memo[node.name] = {node}
            else:
                memo[node.name] = set()
                for n in node.all_input_nodes:
                    memo[node.name] |= placeholders(n)
        return memo[node.name]

    out = set()
    for o in fw_graph["_fx_outputs"]:
        if not hasattr(o, "meta") or o.op == "placeholder":
            continue
        vals = [p.meta.get("val") for p in placeholders(o)]
        if vals and all(v is not None and v.dim() < 3 for v in vals) and \
                any(not v.dtype.is_complex for v in vals):
            out.add(o.name)
    return out


def fsdp_groups(model):
    """[(unit name, FSDPParamGroup)] in module order: "block i" for model.layers[i], else the names of the
    modules fully_shard was given together (e.g. "norm+lm_head")."""
    from torch.distributed.fsdp import FSDPModule
    names, groups = {}, {}
    for name, mod in model.named_modules():
        if not isinstance(mod, FSDPModule):
            continue
        group = mod._get_fsdp_state()._fsdp_param_group
        if group is None:
            continue
        groups.setdefault(id(group), group)
        names.setdefault(id(group), []).append(name)
    out = []
    for gid, group in groups.items():
        unit = "+".join(names[gid])
        if unit.startswith("layers."):
            unit = "block " + unit.split(".")[1]
        out.append((unit, group))
    return out


def fsdp_params(model):
    return [fp for _, g in fsdp_groups(model) for fp in g.fsdp_params]


def storage_names_f8(model):
    """measure_compile_units.storage_names plus the inner storages of float8 unsharded parameters."""
    names = mcu.storage_names(model)
    module_name = {id(m): n for n, m in model.named_modules()}
    for fp in fsdp_params(model):
        if hasattr(fp, "_unsharded_param"):
            base = module_name.get(id(fp._module_info.module), "?") + "." + fp._module_info.param_name
            for attr, inner in inner_tensors(fp._unsharded_param):
                names[storage_key(inner)] = f"{base} ({attr})"
    return names


# --------------------------------------------------------------------------------------------------
# FSDP2 all-gather observation.
# --------------------------------------------------------------------------------------------------

def tensor_facts(t):
    return {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""), "numel": int(t.numel()),
            "bytes": int(t.numel() * t.element_size())}


class AllGatherObserver:
    """Wraps FSDPParam.all_gather_inputs (observation only) and torchao's amax all-reduce."""

    def __init__(self):
        from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
        import torchao.float8.float8_utils as f8u
        self.active = False
        self.passname = "forward"
        self.calls = []            # (pass, FSDPParam, inputs facts, metadata facts, amax all-reduces)
        self.current = None
        observer = self
        fget = FSDPParam.all_gather_inputs.fget

        def all_gather_inputs(fp):
            if not observer.active:
                return fget(fp)
            observer.current = {"all_reduces": []}
            out = fget(fp)
            meta = getattr(getattr(fp, "_extensions_data", None), "all_gather_metadata", None)
            metas = [tensor_facts(m) for m in (meta or ()) if isinstance(m, torch.Tensor)]
            observer.calls.append((observer.passname, fp, [tensor_facts(t) for t in out], metas,
                                   observer.current["all_reduces"]))
            observer.current = None
            return out
        FSDPParam.all_gather_inputs = property(all_gather_inputs)

        all_reduce = f8u.all_reduce

        def counted_all_reduce(tensor, *args, **kwargs):
            if observer.current is not None:
                observer.current["all_reduces"].append(tensor_facts(tensor))
            return all_reduce(tensor, *args, **kwargs)
        f8u.all_reduce = counted_all_reduce

    def start(self):
        self.calls, self.active, self.passname = [], True, "forward"

    def summary(self, model):
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import _get_all_gather_input_metadatas
        module_name = {id(m): n for n, m in model.named_modules()}
        units = []
        for unit, group in fsdp_groups(model):
            ids = {id(fp) for fp in group.fsdp_params}
            for passname in ("forward", "backward"):
                calls = [c for c in self.calls if c[0] == passname and id(c[1]) in ids]
                if not calls:
                    continue
                first = {}
                for c in calls:  # one unshard per pass: each parameter's first call
                    first.setdefault(id(c[1]), c)
                params, fake_inputs = [], []
                for fp in group.fsdp_params:
                    c = first.get(id(fp))
                    if c is None:
                        continue
                    _, _, inputs, metas, reduces = c
                    params.append({
                        "name": module_name.get(id(fp._module_info.module), "?") + "."
                                + fp._module_info.param_name,
                        "sharded_dtype": str(fp._sharded_param_data.dtype).replace("torch.", ""),
                        "wrapper": type(fp._sharded_local_tensor).__name__,
                        "all_gather_inputs": [{k: i[k] for k in ("dtype", "numel", "bytes")} for i in inputs],
                        "all_gather_metadata": metas,
                        "amax_all_reduces": len(reduces),
                    })
                    fake_inputs.append([torch.empty(0, dtype=getattr(torch, i["dtype"])) for i in inputs])
                _, _, dtype = _get_all_gather_input_metadatas(fake_inputs)
                item = torch.empty(0, dtype=dtype).element_size()
                total_bytes = sum(i["bytes"] for p in params for i in p["all_gather_inputs"])
                rec = {
                    "unit": unit, "pass": passname,
                    "all_gather_input_bytes": total_bytes,
                    "all_gather_buffer_dtype": str(dtype).replace("torch.", ""),
                    "all_gather_buffer_numel_per_rank": total_bytes // item,
                    "metadata_bytes": sum(m["bytes"] for p in params for m in p["all_gather_metadata"]),
                    "amax_all_reduce_count": sum(p["amax_all_reduces"] for p in params),
                    "all_gather_inputs_calls": len(calls),
                }
                if passname == "forward" and unit not in ("block 1", "block 2"):  # the blocks are alike
                    rec["params"] = params
                units.append(rec)
        return units


def all_gather_probe(model):
    """FSDP2's multi-rank all-gather (foreach_all_gather: copy-in + dist.all_gather_single) per unit, on
    the 1-rank gloo group, after the step (parameters sharded). Returns the buffer facts or the error."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import foreach_all_gather
    out = []
    for unit, group in fsdp_groups(model):
        rec = {"unit": unit}
        try:
            result = foreach_all_gather(
                group.fsdp_params, group._all_gather_process_group, False,
                *group.comm_ctx.get_all_gather_streams(False, group._training_state),
                group.device, group._all_gather_comm)
            o = result.all_gather_output
            rec.update({"ok": True, "all_gather_output_dtype": str(o.dtype).replace("torch.", ""),
                        "all_gather_output_bytes": int(o.numel() * o.element_size()),
                        "param_all_gather_input_dtypes": [[str(d).replace("torch.", "") for d in ds]
                                                          for ds in result.param_all_gather_input_dtypes]})
        except Exception as e:
            rec.update({"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"})
        out.append(rec)
    return out


def gloo_dtype_probe():
    """gloo's all_gather_into_tensor on one rank per dtype."""
    import torch.distributed as dist
    out = {}
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.uint8, torch.bfloat16):
        inp = torch.ones(16).to(dtype)
        res = torch.empty(16, dtype=dtype)
        try:
            dist.all_gather_into_tensor(res, inp)
            ok = bool(torch.equal(res.view(torch.uint8), inp.view(torch.uint8)))
            out[str(dtype).replace("torch.", "")] = "ok" if ok else "ran, output differs"
        except Exception as e:
            out[str(dtype).replace("torch.", "")] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return out


def scaled_mm_cpu_probe():
    """torch._scaled_mm on CPU per float8 dtype pair and scale granularity, against a dequantized matmul."""
    torch.manual_seed(0)
    a, b = torch.randn(32, 64), torch.randn(48, 64)
    out = {}
    for da in (torch.float8_e4m3fn, torch.float8_e5m2):
        for db in (torch.float8_e4m3fn, torch.float8_e5m2):
            A, B = a.to(da), b.to(db).t()
            for gran, sa, sb in (("tensorwise", torch.tensor(0.5), torch.tensor(2.0)),
                                 ("rowwise", torch.rand(32, 1) + 0.5, torch.rand(1, 48) + 0.5)):
                key = f"{str(da)[6:]} x {str(db)[6:]} {gran}"
                try:
                    got = torch._scaled_mm(A, B, scale_a=sa, scale_b=sb, out_dtype=torch.float32)
                    ref = (A.float() * sa) @ (B.float() * sb)
                    out[key] = "ok" if torch.allclose(got, ref, rtol=1e-5, atol=1e-4) else "differs"
                except Exception as e:
                    out[key] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return out


# --------------------------------------------------------------------------------------------------
# Building the model as torchtitan does, with float8.
# --------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def float8_hardware_check_passed():
    """torchtitan's converter refuses without an SM89 GPU: its check (only) answers True meanwhile."""
    import torchtitan.components.quantization.float8 as tf8
    orig = tf8.has_cuda_capability
    tf8.has_cuda_capability = lambda *a, **k: True
    try:
        yield
    finally:
        tf8.has_cuda_capability = orig


def float8_converter(f8, compiled):
    """torchtitan's Float8LinearConverter for the setting (built as model_registry builds converters)."""
    from torchtitan.components.quantization import Float8LinearConverter
    s = FLOAT8[f8]
    filter_fqns = ["lm_head"] + (["auto_filter_small_kn"] if s.get("auto_filter") else [])
    cfg = Float8LinearConverter.Config(recipe_name=s["recipe"], filter_fqns=filter_fqns,
                                       emulate=s.get("emulate", False), model_compile_enabled=compiled)
    if s.get("emulate"):
        return cfg.build()  # torchtitan's own CPU path: no check to pass
    with float8_hardware_check_passed():
        return cfg.build()


def titan_filter(fqn_filters=("lm_head",)):
    from torchtitan.components.quantization.utils import module_filter_fn
    return lambda mod, fqn: module_filter_fn(mod, fqn, list(fqn_filters))


def build_model(f8, ckpt, seq_len, compiled):
    """Config (float8 converter) -> build -> [torchao conversion] -> AC -> apply_compile -> FSDP2."""
    from torchtitan.config import CompileConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.compile import apply_compile
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder
    s = FLOAT8[f8]
    config = mu.torchtitan_model_config(CONFIG, seq_len)
    converter = None
    if s["recipe"] is not None and s["via"] == "converter":
        converter = float8_converter(f8, compiled)
        config = converter.convert(config)
    torch.manual_seed(0)
    model = config.build()
    model.init_states(buffer_device=torch.device("cpu"))
    model.train()
    if s["recipe"] is not None and s["via"] == "torchao":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        convert_to_float8_training(
            model, module_filter_fn=titan_filter(),
            config=Float8LinearConfig(enable_fsdp_float8_all_gather=s["fsdp_float8_all_gather"]))
    mu.apply_torchtitan_ac(model, ckpt)
    if compiled:
        apply_compile(model, compile_config=CompileConfig(enable=True),
                      parallel_dims=ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1,
                                                 world_size=1))
    mesh = mu.init_single_rank_gloo()
    apply_fsdp_to_decoder(model, mesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                          pp_enabled=False)
    return model, converter


def block_linears(model):
    """Block 0's linears: converted or not, their shapes and cast configs."""
    from torchao.float8.float8_linear import Float8Linear
    out = []
    for name, mod in model.layers["0"].named_modules():
        if isinstance(mod, torch.nn.Linear):
            rec = {"module": name.replace("_checkpoint_wrapped_module.", ""),
                   "class": type(mod).__module__ + "." + type(mod).__qualname__,
                   "in_features": mod.in_features, "out_features": mod.out_features,
                   "float8": isinstance(mod, Float8Linear)}
            if rec["float8"]:
                c = mod.config
                rec["cast_configs"] = mod.extra_repr().split("cast_configs=")[1].rstrip('"')
                rec["round_scales_to_power_of_2"] = c.round_scales_to_power_of_2
                rec["enable_fsdp_float8_all_gather"] = c.enable_fsdp_float8_all_gather
                rec["emulate"] = c.emulate
                rec["weight_wrapper"] = type(mod.weight.to_local() if hasattr(mod.weight, "to_local")
                                             else mod.weight).__name__
            out.append(rec)
    return out


def linear_filters():
    """Which Linear.Config each filter torchtitan's converter can use accepts (True: converted), and what
    torchao's own auto filter says of the same linear as an nn.Linear."""
    from torchao.float8 import _auto_filter_for_recipe
    from torchtitan.components.quantization import Float8LinearConverter
    from torchtitan.models.common.linear import Linear
    config = mu.torchtitan_model_config(CONFIG, 64)
    emulate_casts = torch._inductor.config.emulate_precision_casts
    out = {}
    for recipe in ("tensorwise", "rowwise"):
        with float8_hardware_check_passed():
            plain = Float8LinearConverter.Config(recipe_name=recipe, filter_fqns=["lm_head"]).build()
            auto = Float8LinearConverter.Config(recipe_name=recipe,
                                                filter_fqns=["lm_head", "auto_filter_small_kn"]).build()
        rows = []
        for fqn, lc, _, _ in config.traverse(Linear.Config):
            if not (fqn.startswith("layers.0.") or fqn == "lm_head"):
                continue
            mod = torch.nn.Linear(lc.in_features, lc.out_features, bias=False, device="meta")
            rows.append({
                "fqn": fqn, "in_features": lc.in_features, "out_features": lc.out_features,
                "filter_fqns=['lm_head']": bool(plain.filter_fn(lc, fqn)),
                "filter_fqns=[]": bool(titan_filter(())(lc, fqn)),
                "filter_fqns=['lm_head', 'auto_filter_small_kn']": bool(auto.filter_fn(lc, fqn)),
                "torchao _auto_filter_for_recipe on the nn.Linear": bool(
                    _auto_filter_for_recipe(recipe, ["lm_head"])(mod, fqn)),
            })
        out[recipe] = rows
    torch._inductor.config.emulate_precision_casts = emulate_casts  # the rowwise converter sets it
    return out


# --------------------------------------------------------------------------------------------------
# One case.
# --------------------------------------------------------------------------------------------------

def bf16_reference(ckpt, seq_len, batch, mode):
    """The same bf16 case's id in this corpus and in the earlier corpora (where they have it)."""
    base = f"torchtitan/{CONFIG}/bf16-mixed/flash"
    ref = {"this_corpus": case_name("none", ckpt, seq_len, batch, mode)}
    if mode == "eager":
        ref["oracle_units.json"] = f"{base}/upcast/{ckpt}/s{seq_len}-b{batch}"
        if ckpt != "selective-op":
            ref["oracle_compile_units.json"] = f"{base}/upcast/{ckpt}/s{seq_len}-b{batch}/eager"
    elif ckpt != "selective-op":
        ref["oracle_compile_units.json"] = f"{base}/fused/{ckpt}/s{seq_len}-b{batch}/compiled"
    return ref


def case_name(f8, ckpt, seq_len, batch, mode):
    return f"torchtitan/{CONFIG}/bf16-mixed/float8-{f8}/{ckpt}/s{seq_len}-b{batch}/{mode}"


def run_case(f8, ckpt, seq_len, batch, mode, observer, ag_observer):
    compiled = mode == "compiled"
    s = FLOAT8[f8]
    group = dict(recipe="torchtitan", config=CONFIG, model_class="torchtitan.models.llama3.Llama3Model",
                 precision="bf16-mixed", attention="flash", checkpointing=ckpt, loss="upcast")
    torch._dynamo.reset()
    emulate_casts = torch._inductor.config.emulate_precision_casts
    try:
        model, converter = build_model(f8, ckpt, seq_len, compiled)
        precompute = None
        if s.get("precompute"):
            from torch.distributed.tensor.debug import CommDebugMode
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp
            with CommDebugMode() as comm:
                precompute_float8_dynamic_scale_for_fsdp(model)
            scales = [m.weight._local_tensor._precomputed_scale for m in model.modules()
                      if getattr(getattr(m, "weight", None), "_local_tensor", None) is not None
                      and getattr(m.weight._local_tensor, "_precomputed_scale", None) is not None]
            precompute = {"scales": len(scales),
                          "scale": tensor_facts(scales[0]) if scales else None,
                          "scale_storage_bytes": int(scales[0].untyped_storage().nbytes()) if scales else 0,
                          "collectives_counted": {str(k): v for k, v in comm.get_comm_counts().items()},
                          "note": "one all-reduce of the stacked amaxes (DTensor Partial -> Replicate) on "
                                  "N ranks; on this 1-rank mesh no collective is issued"}
        linears = block_linears(model)
        recorder = Float8Recorder()
        layers = list(model.layers.values())
        labels = None
        if compiled:
            markers = mcu.CompiledBlockMarkers(recorder, layers)
            handles = [model.norm.register_forward_pre_hook(lambda *_: recorder.set_unit(mu.UNIT_HEAD))]
        else:
            markers = None
            handles = mu.install_unit_markers(recorder, layers, model.norm)
            labels = ModuleLabels(recorder, layers[0])
        classifier = Float8StorageClassifier(model)
        loss_fn = mu.build_torchtitan_loss(group, model, recorder)
        observer.start_case(recorder)
        ag_observer.start()
        loss, _, _ = mu.run_torchtitan(model, loss_fn, group, seq_len, batch, recorder)
        classifier.note_fsdp_unsharded(model)
        fw = next((g for g in observer.graphs if g.get("unit") == "block" and g["pass"] == "forward"), None)
        derived = parameter_only_outputs(fw) if fw is not None else set()
        if derived:  # every block runs the same graph: match each block's saved tensors to its outputs
            casts = set()
            for i in range(len(layers)):
                unit = f"block {i}"
                rows_i, matched_i = mcu.block_tensor_list(recorder, classifier, unit, {}, {}, fw)
                keys = [key for u, _, key, _ in recorder.events if u == unit]
                if matched_i:
                    casts.update(k for row, k in zip(rows_i, keys)
                                 if row["kind"] == "activation" and row["graph_output"]["fx_node"] in derived)
            classifier.weight_cast_storages = frozenset(casts)
        units = mu.summarise_units(recorder, classifier, len(layers), False)
        rows, matched = mcu.block_tensor_list(recorder, classifier, "block 0", storage_names_f8(model),
                                              markers.inputs if markers else {}, fw)
        for row in rows:
            if fw is not None and "graph_output" in row:
                row["computed_from_parameters_only"] = row["graph_output"]["fx_node"] in derived
        extras = [x for (u, _, _, _), x in zip(recorder.events, recorder.extra) if u == "block 0"]
        for row, x in zip(rows, extras):
            if x.get("module") is not None:
                row["module"] = x["module"]
            if "subclass" in x:
                row.update({"subclass": x["subclass"], "subclass_inner": x["inner"],
                            "subclass_outer_shape": x["outer_shape"],
                            "subclass_outer_dtype": x["outer_dtype"]})
        for h in handles:
            h.remove()
        if markers:
            markers.remove()
        if labels:
            labels.remove()
        ag_observer.passname = "backward"
        loss.backward()
        ag_observer.active = False
        if not any(p.grad is not None for p in model.parameters()):
            raise RuntimeError("backward produced no gradient")
        all_gather = ag_observer.summary(model)
        probe = all_gather_probe(model)
    finally:
        ag_observer.active = False
        torch._inductor.config.emulate_precision_casts = emulate_casts

    f8_record = {"setting": f8, "recipe": s["recipe"] or "none",
                 "applied_by": ("none" if s["recipe"] is None else
                                "torchtitan Float8LinearConverter (model config, before build)"
                                if s["via"] == "converter" else
                                "torchao convert_to_float8_training (built model)"),
                 "enable_fsdp_float8_all_gather": bool(s.get("fsdp_float8_all_gather", False)),
                 "precompute_float8_dynamic_scale_for_fsdp": bool(s.get("precompute", False)),
                 "emulate": bool(s.get("emulate", False)),
                 "filter_fqns": (["lm_head"] + (["auto_filter_small_kn"] if s.get("auto_filter") else []))
                 if s["recipe"] else [],
                 "scaled_mm": "none" if s["recipe"] is None else
                 ("torchao emulation (high-precision matmul)" if s.get("emulate") else "native CPU torch._scaled_mm"),
                 "converted_linears": [r["module"] for r in linears if r["float8"]],
                 "bf16_linears": [r["module"] for r in linears if not r["float8"]]}
    if converter is not None:
        f8_record["torchao_config"] = repr(converter.torchao_config)
    if precompute is not None:
        f8_record["precompute"] = precompute
    record = {k: v for k, v in group.items() if k != "model_class"}
    record.update({
        "id": case_name(f8, ckpt, seq_len, batch, mode), "mode": mode,
        "compile": "model (apply_compile, inductor, fullgraph)" if compiled else "none",
        "seq_len": seq_len, "micro_batch": batch, "float8": f8_record, "units": units,
        "block0_linears": linears, "block0_saved_tensors": rows,
        "fsdp_all_gather": all_gather, "all_gather_probe": probe,
        "bf16_reference": bf16_reference(ckpt, seq_len, batch, mode),
        "loss": float(loss.detach()),
    })
    if compiled:
        record["block0_saved_tensors_match_graph_outputs"] = matched
        record["graphs"] = [{k: v for k, v in g.items() if k not in ("_fx_outputs", "node_list")}
                            for g in observer.graphs]
    return record


def compare_with_corpora(cases, root):
    """bf16 rows of this run against oracle_units.json / oracle_compile_units.json (printed only), and the
    float8 rows' block-0 bytes against this run's bf16 row of the same case (written as bf16_delta)."""
    corpora = {}
    for name in ("oracle_units.json", "oracle_compile_units.json"):
        path = os.path.join(root, "tests/costmodel/data", name)
        if os.path.exists(path):
            with open(path) as f:
                corpora[name] = {c["id"]: c for c in json.load(f)["cases"]}
    same = differ = 0
    by_id = {c["id"]: c for c in cases}
    for c in cases:
        ref = c["bf16_reference"]
        if ref.get("this_corpus") not in by_id or ref.get("this_corpus") == c["id"]:
            ref.pop("this_corpus", None)
        if c["float8"]["recipe"] == "none":
            for name, rows in corpora.items():
                o = rows.get(ref.get(name))
                if o is None:
                    continue
                ok = all(c["units"][u][f] == o["units"][u][f] for u in c["units"] if u.startswith("block")
                         for f in mu.KIND_FIELD.values())
                same += ok
                differ += not ok
                if not ok:
                    print(f"DIFFERS from {name}: {c['id']}", file=sys.stderr)
            continue
        base = by_id.get(ref.get("this_corpus")) or corpora.get("oracle_compile_units.json", {}).get(
            ref.get("oracle_compile_units.json"))
        if base is not None:
            c["bf16_delta_block0"] = {f: c["units"]["block 0"][f] - base["units"]["block 0"][f]
                                      for f in mu.KIND_FIELD.values()}
    print(f"bf16 block rows vs earlier corpora: {same} equal, {differ} differ", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--only", default=None,
                        help="debugging: run only the cases whose id contains one of these comma-separated texts")
    args = parser.parse_args()

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    warnings.filterwarnings("ignore")
    import logging
    logging.getLogger("torchtitan").setLevel(logging.WARNING)
    import torch._inductor.config as inductor_config
    inductor_config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    observer = mcu.InductorObserver()
    ag_observer = AllGatherObserver()
    start = time.time()
    mu.init_single_rank_gloo()
    meta_probes = {"scaled_mm_cpu_probe": scaled_mm_cpu_probe(), "gloo_dtype_probe": gloo_dtype_probe(),
                   "linear_filters": linear_filters()}

    cases, dropped = [], []
    for f8, ckpt, mode, shapes in case_plan():
        for s, b in shapes:
            cid = case_name(f8, ckpt, s, b, mode)
            if args.only and not any(t in cid for t in args.only.split(",")):
                continue
            t0 = time.time()
            try:
                cases.append(run_case(f8, ckpt, s, b, mode, observer, ag_observer))
            except Exception as e:
                dropped.append({"case": cid, "error": f"{type(e).__name__}: {str(e)[:2000]}"})
                print(f"DROPPED {cid}: {type(e).__name__}: {str(e)[:2000]}", file=sys.stderr)
                continue
            blk = cases[-1]["units"]["block 0"]
            print(f"{cid}: block activation {blk['activation_bytes']}, unsharded "
                  f"{blk['fsdp_unsharded_param_bytes']}, {time.time() - t0:.1f} s", file=sys.stderr)

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    compare_with_corpora(cases, root)
    losses = {}
    for c in cases:  # the loss's float bits are not part of the corpus; agreement with bf16 is
        losses.setdefault((c["checkpointing"], c["seq_len"], c["micro_batch"]), {})[c["id"]] = c.pop("loss")
    for c in cases:  # against the eager bf16 case of the same checkpointing and shape
        group = losses[(c["checkpointing"], c["seq_len"], c["micro_batch"])]
        ref = group.get(case_name("none", c["checkpointing"], c["seq_len"], c["micro_batch"], "eager"))
        if ref is not None:
            c["loss_within_5pct_of_bf16_eager"] = abs(group[c["id"]] - ref) <= 0.05 * abs(ref)

    from importlib.metadata import version
    versions = mu.versions()
    versions["torchao"] = version("torchao")
    command = ("python validation/measure_float8_units.py --out " + mu.repo_relative(args.out)
               + (f" --only {args.only}" if args.only else ""))
    out = {
        "schema_version": 1,
        "generated_by": GENERATED_BY,
        "command": command,
        "versions": versions,
        "meta": {
            "generated_by": GENERATED_BY, "command": command, "versions": versions,
            "torch_threads": torch.get_num_threads(),
            "float8_settings": {k: {kk: vv for kk, vv in v.items()} for k, v in FLOAT8.items()},
            "float8_application": {
                "converter": "torchtitan.components.quantization.Float8LinearConverter(Config(recipe_name, "
                             "filter_fqns=['lm_head'], emulate, model_compile_enabled)).convert(model_config) "
                             "before config.build(), as torchtitan.models.llama3.model_registry applies "
                             "converters",
                "hardware_check": "has_cuda_capability(8, 9) answered True while the converter is built "
                                  "(emulate cases excepted)",
                "fsdp_float8_all_gather": "torchao.float8.convert_to_float8_training(model, config="
                                          "Float8LinearConfig(enable_fsdp_float8_all_gather=True), "
                                          "module_filter_fn=torchtitan's module_filter_fn(['lm_head'])) on the "
                                          "built model, before AC/compile/FSDP2",
                "precompute": "torchao.float8.precompute_float8_dynamic_scale_for_fsdp(model) after FSDP2, "
                              "before the forward",
                "scaled_mm": "native CPU torch._scaled_mm in every non-emulate case (no reference GEMM)",
            },
            **meta_probes,
        },
        "configs": {CONFIG: dict(mu.CONFIGS[CONFIG])},
        "torchtitan_args": {CONFIG: mu.TORCHTITAN_ARGS[CONFIG]},
        "shapes": {"eager": [{"seq_len": s, "micro_batch": b} for s, b in EAGER_SHAPES],
                   "compiled": [{"seq_len": s, "micro_batch": b} for s, b in COMPILED_SHAPES]},
        "cases": cases,
        "dropped": dropped,
        "not_measured": NOT_MEASURED,
    }
    mu.write_corpus_json(args.out, out, f"{len(cases)} cases, {len(dropped)} dropped", start)


if __name__ == "__main__":
    main()
