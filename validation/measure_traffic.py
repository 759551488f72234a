#!/usr/bin/env python3
"""Measure, with the frameworks' own model code, the bytes each unit's memory-bound ops move.

What it measures
----------------
Every ATen op a training step dispatches (forward, loss and backward) is seen by a
``TorchDispatchMode``. Each op is put in one class:

* ``gemm``: mm, addmm, bmm, baddbmm, addmv, linear (the tensor-core work, timed by FLOPs);
* ``attention``: the scaled-dot-product-attention kernels and their backward (timed by their own rate);
* ``view``: ops that only make a new view or alias of a storage (no element moves);
* ``framework``: FSDP2's copy-in/copy-out and the collectives (communication, not the recipe's compute);
* ``memory_bound``: everything else: norms as the model code writes them, casts, element-wise math,
  reductions, embedding lookups and their backward, the loss's log-softmax and its gradient, gradient
  accumulation into ``.grad``.

For a memory-bound op the bytes moved are the bytes of its tensor inputs read plus its tensor outputs
written, each ``min(numel * element_size, storage bytes)`` (a broadcast input is read once; an
embedding lookup reads the rows it returns, not the table; the negative log-likelihood reads one
log-probability per row). An op
that writes in place counts the written tensor once as input (read) and once as output (written).

Ops are attributed to the unit running them: in forward the unit markers of measure_units.py
(decoder layer i's forward pre-hook starts "block i", the final norm's starts "head"); in backward
the loss's backward and the final norm's are "head", decoder layer i's
backward pre-hook starts "block i" and the token embedding's starts "embedding". Each unit's record
gives bytes and op counts per class, forward (with the loss) and backward (with the recompute of
checkpointed blocks) apart.

The cases are measure_units.py's recipes (transformers' HF models and torchtitan's Llama 3, which the
cost model's per-recipe accounting follows), on a CPU: an op that CUDA runs as one fused kernel (the
flash attention kernels, torch's fused RMSNorm) is one op here too, but a CPU decomposition of a fused
CUDA op (F.rms_norm outside CUDA) shows as its parts; the cost model says which it counts.

Regenerate: python validation/measure_traffic.py --out tests/costmodel/data/oracle_traffic.json
(about two minutes on two cores; the versions are written into the file).
"""

import argparse
import contextlib
import json
import os
import sys
import time
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure_units as mu  # noqa: E402  (the same model builders as the memory corpus)

SHAPES = [(64, 1), (128, 2)]  # (seq_len, micro_batch)

GEMM_OPS = {"mm", "addmm", "bmm", "baddbmm", "addmv", "linear", "matmul", "_addmm_activation"}
VIEW_OPS = {"view", "_unsafe_view", "t", "transpose", "permute", "expand", "as_strided", "slice",
            "select", "unsqueeze", "squeeze", "alias", "detach", "reshape", "split", "split_with_sizes",
            "chunk", "unbind", "view_as_real", "view_as_complex", "_reshape_alias", "unflatten",
            "flatten", "narrow", "lift_fresh", "_to_copy_view", "diagonal", "expand_as", "view_as",
            "movedim", "unsafe_split", "unsafe_chunk", "set_", "resize_", "_has_compatible_shallow_copy_type",
            "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "is_same_size",
            "_local_scalar_dense", "size", "stride", "storage_offset", "sym_size", "sym_stride",
            "sym_numel", "sym_storage_offset", "dim", "is_contiguous", "copy_for_dtensor"}
FRAMEWORK_NAMESPACES = {"fsdp", "_c10d_functional", "c10d", "_dtensor", "c10d_functional"}
FRAMEWORK_OPS = {"split_with_sizes_copy", "chunk_cat", "_foreach_copy_", "record_stream"}


def op_class(func):
    ns = func.namespace
    name = func.__name__.split(".")[0]
    if ns in FRAMEWORK_NAMESPACES or name in FRAMEWORK_OPS:
        return "framework"
    if "scaled_dot_product" in name or "flash_attention" in name or "efficient_attention" in name:
        return "attention"
    if name in GEMM_OPS:
        return "gemm"
    if name in VIEW_OPS:
        return "view"
    return "memory_bound"


def tensor_bytes(t):
    n = t.numel() * t.element_size()
    try:
        return min(n, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return n


class TrafficMode(TorchDispatchMode):
    """Sums, per (unit, phase, class), the bytes read and written and the op count."""

    def __init__(self):
        super().__init__()
        self.unit, self.phase = mu.UNIT_EMBEDDING, "forward"
        self.totals = {}  # (unit, phase, class) -> [bytes, ops]
        self.op_names = {}  # memory-bound op name -> count (for the record)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        cls = op_class(func)
        moved = 0
        if cls == "memory_bound":
            ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            name = func.__name__.split(".")[0]
            moved = 0
            if name == "embedding":  # a lookup reads the rows it returns, not the whole table
                moved = sum(tensor_bytes(t) for t in outs)
                ins = ins[1:]
            elif name in ("nll_loss_forward", "nll_loss_backward"):
                # The [T, V] input is only indexed: one element per row is read (the backward
                # writes the whole gradient, counted as its output).
                rows = [t for t in ins if t.dim() == 2]
                moved = sum(t.shape[0] * t.element_size() for t in rows)
                ins = [t for t in ins if t.dim() != 2]
            moved += sum(tensor_bytes(t) for t in ins) + sum(tensor_bytes(t) for t in outs)
            self.op_names[name] = self.op_names.get(name, 0) + 1
        key = (self.unit, self.phase, cls)
        entry = self.totals.setdefault(key, [0, 0])
        entry[0] += moved
        entry[1] += 1
        return out


def install_backward_markers(mode, layers, final_norm, embedding):
    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_full_backward_pre_hook(
            lambda *_, name=f"block {i}": setattr(mode, "unit", name)))
    handles.append(embedding.register_full_backward_pre_hook(
        lambda *_: setattr(mode, "unit", mu.UNIT_EMBEDDING)))
    return handles


class ForwardMarkers:
    """measure_units' unit markers, pointed at the traffic mode instead of a saved-tensor recorder."""

    def __init__(self, mode):
        self.mode = mode

    def set_unit(self, name):
        self.mode.unit = name.split("/")[0]  # chunked loss chunks are all "head"


def hf_embedding(model):
    return model.get_input_embeddings()


def measure(group, seq_len, batch):
    mode = TrafficMode()
    markers = ForwardMarkers(mode)
    if group["recipe"] == "hf":
        model = mu.build_hf_model(group)
        layers, norm = mu.hf_parts(model)
        embedding = hf_embedding(model)
    else:
        model = build_torchtitan_unsharded(group, seq_len)
        layers, norm = list(model.layers.values()), model.norm
        embedding = model.tok_embeddings
    torch.manual_seed(1)
    vocab = mu.CONFIGS[group["config"]].get("vocab_size")
    ids = torch.randint(0, vocab, (batch, seq_len))
    handles = mu.install_unit_markers(markers, layers, norm)
    handles += install_backward_markers(mode, layers, norm, embedding)  # armed by the forward
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16)
                if group["precision"] == "bf16-mixed" and group["recipe"] == "hf"
                else contextlib.nullcontext())
    with mode:
        mode.unit = mu.UNIT_EMBEDDING
        with autocast:
            if group["recipe"] == "hf":
                loss = model(input_ids=ids, labels=ids).loss
            else:
                from torchtitan.components.loss import CrossEntropyLoss
                pred = model(ids)
                loss, _ = CrossEntropyLoss.Config().build()(pred, ids, torch.tensor(batch * seq_len))
        mode.unit, mode.phase = mu.UNIT_HEAD, "backward"
        loss.backward()
    for h in handles:
        h.remove()
    units = {}
    for (unit, phase, cls), (moved, ops) in sorted(mode.totals.items()):
        u = units.setdefault(unit, {})
        p = u.setdefault(phase, {})
        p[cls] = {"bytes": moved, "ops": ops}
    return {
        **group, "id": mu.case_id(group, seq_len, batch), "seq_len": seq_len, "micro_batch": batch,
        "units": units, "memory_bound_ops": dict(sorted(mode.op_names.items())),
    }


def build_torchtitan_unsharded(group, seq_len):
    """torchtitan's Llama 3 as measure_units builds it, with FSDP2's effect on one rank kept (the
    blocks compute with parameters in param_dtype) and its copy-in/copy-out left out: those move
    parameters and gradients per collective, which the communication model times."""
    import torchtitan.distributed.fsdp as fsdp

    def cast_only(model, mesh, param_dtype, reduce_dtype, pp_enabled):
        model.to(param_dtype)
    saved = fsdp.apply_fsdp_to_decoder
    fsdp.apply_fsdp_to_decoder = cast_only
    try:
        return mu.build_torchtitan_model(group, seq_len)
    finally:
        fsdp.apply_fsdp_to_decoder = saved


def case_plan():
    groups = []
    for config, cls in (("llama-h128", "LlamaForCausalLM"), ("llama-h64", "LlamaForCausalLM"),
                        ("qwen2-h128", "Qwen2ForCausalLM"), ("gpt2-h128-nodrop", "GPT2LMHeadModel"),
                        ("gpt-neox-h128", "GPTNeoXForCausalLM")):
        for precision in ("fp32", "bf16-mixed"):
            for ckpt in ("none", "full"):
                groups.append(dict(recipe="hf", config=config, model_class=cls, precision=precision,
                                   attention="flash", checkpointing=ckpt, loss="upcast"))
    for precision in ("fp32", "bf16-mixed"):
        for ckpt in ("none", "full", "selective-op"):
            groups.append(dict(recipe="torchtitan", config="torchtitan-llama3-h128",
                               model_class="torchtitan.models.llama3.Llama3Model",
                               precision=precision, attention="flash", checkpointing=ckpt,
                               loss="upcast"))
    return groups


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default=None, help="run only the case groups whose id contains this")
    args = parser.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    warnings.filterwarnings("ignore")
    start = time.time()
    cases, dropped = [], []
    for group in case_plan():
        if args.only and args.only not in mu.case_id(group, 0, 0):
            continue
        for seq_len, batch in SHAPES:
            try:
                cases.append(measure(group, seq_len, batch))
            except Exception as e:  # a framework that cannot run the case is reported, not hidden
                dropped.append({"group": group, "error": f"{type(e).__name__}: {e}"})
                print(f"DROPPED {group}: {type(e).__name__}: {e}", file=sys.stderr)
                break
            print(cases[-1]["id"], file=sys.stderr)
    out = {
        "schema_version": 1,
        "generated_by": "validation/measure_traffic.py",
        "command": "python validation/measure_traffic.py --out " + mu.repo_relative(args.out)
                   + (f" --only {args.only}" if args.only else ""),
        "versions": mu.versions(),
        "configs": {name: dict(cfg) for name, cfg in mu.CONFIGS.items()},
        "cases": cases,
        "dropped": dropped,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{len(cases)} cases, {len(dropped)} dropped, {time.time() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
