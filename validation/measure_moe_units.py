#!/usr/bin/env python3
"""Measure, with transformers' own mixture-of-experts models, the bytes autograd saves for backward per unit.

What it measures
----------------
The decoder layers ("block i") of four transformers MoE causal LMs, measured as validation/measure_units.py
measures a dense block, with its own pieces (imported, not copied): ``build_hf_model`` (random init with
``torch.manual_seed(0)``, float32 parameters, ``model.train()``, ``_attn_implementation`` "sdpa" for
attention "flash" and "eager" for "eager", ``activation_checkpointing_enable`` with ``use_reentrant=False``
for checkpointing "full"), ``run_hf`` (``torch.manual_seed(1)`` then ``torch.randint(0, vocab, (b, s))`` as
input ids and labels, one forward with ``labels=`` so the loss is ``ForCausalLMLoss``; bf16-mixed is
``torch.autocast("cpu", dtype=torch.bfloat16)`` around forward and loss, parameters stay fp32),
``SavedTensorRecorder`` (``torch.autograd.graph.saved_tensors_hooks``), the unit markers and
``summarise_units`` (each storage counted once, in the first unit that saved it; classes parameter,
buffer, weight_copy, activation). The embedding and head units come along, so each case has the same
``units`` layout as tests/costmodel/data/oracle_units.json. A block's saved bytes are its
``activation_bytes`` + ``weight_copy_bytes`` (``parameter_bytes`` are the parameters' own storages).

Models (CONFIGS; hidden 64, 4 heads over 2 key/value heads of 16, 2 layers, vocab 128, 8 experts, top-2,
expert width 32, no dropout, no router jitter, ``output_router_logits`` False as the configs default):
``MixtralForCausalLM``, ``Qwen3MoeForCausalLM`` (q_norm/k_norm per head), ``OlmoeForCausalLM`` (q_norm/k_norm
over the whole projection), ``Qwen2MoeForCausalLM`` (a shared expert of width 48 behind a sigmoid
``shared_expert_gate``; biased q/k/v as its config defaults). Qwen2/Qwen3-MoE and OLMoE keep their default
``norm_topk_prob`` (False); Mixtral always renormalizes its top-k.

The experts' dispatch. transformers 5.23 decorates every ``<Arch>Experts`` with
``transformers.integrations.moe.use_experts_implementation``: its forward looks up
``config._experts_implementation`` in ``ALL_EXPERTS_FUNCTIONS``. ``PreTrainedModel.__init__`` resolves an
unset value with ``get_correct_experts_implementation``: "grouped_mm" whenever the class carries the
decorator, on any device, so "grouped_mm" is the default here (CPU, training). Its forward
(``grouped_mm_experts_forward``) sorts the k*T (token, expert) pairs by expert, gathers the token rows
(``hidden_states[perm // k]``, a k*T x h copy), runs ``torch.nn.functional.grouped_mm`` with the expert
offsets (torch 2.15 on CPU: ``_can_use_grouped_mm`` is True; the call casts its input to the weight's
dtype and is not autocast-enabled, so under bf16 autocast the experts' GEMMs run in fp32 against the
fp32 weights), weights the rows, un-permutes them and sums the k rows of each token. The other paths:
"eager" (the class's own forward: a Python loop over the experts hit, ``hidden_states[token_idx]`` and
``F.linear`` per expert, ``index_add_``) and "batched_mm" (``repeat_interleave`` of the tokens and a
gather of every pair's expert weights, ``gate_up_proj[expert_ids]``: [k*T, 2*I, h], then ``torch.bmm``).
All three are measured (set with ``PreTrainedModel.set_experts_implementation``); each case records
the configured name and the kernels its saved tensors came from (``experts_kernels``).

Grid: model x experts implementation x precision (fp32, bf16-mixed) x attention (flash = sdpa, eager) x
checkpointing (none, full) x shape (seq 128/256 x micro-batch 1/2). The default path (grouped_mm) runs
the whole grid; eager and batched_mm run attention flash without checkpointing (what they change lies in
the MLP, and a checkpointed block keeps only its input).

What each case adds to measure_units' record
--------------------------------------------
* ``experts_implementation`` (configured) and ``experts_kernels`` (grad_fn names of the saved tensors the
  experts module produced or saved that are GEMMs: GroupedMmBackward0, MmBackward0, BmmBackward0, ...).
* ``routing``: per block, from a forward hook on the router (``mlp.gate``, which returns router_logits,
  top-k weights, top-k indices): ``tokens_per_expert`` (T = seq * micro-batch tokens, top_k choices each:
  the list sums to top_k * T, checked), the experts hit, the dtypes of logits and top-k weights,
  ``router_logits_saved`` (whether the logits' storage is among the tensors autograd saved),
  ``router_logits_returned`` (whether the model output carries them: only with ``output_router_logits``),
  and, checkpointed, whether the recompute in backward routed the same way.
* ``tensors`` lists (measure_units' entries: shape, dtype, storage bytes, the producing ``grad_fn``, kind,
  sharing flags): every unit's at the first shape of each group (measure_units' rule), and block 1's at
  every shape (the last block: all its storages are its own except the rotary cos/sin block 0 saved
  first, flagged ``shared_with_earlier_unit``); every unit's byte totals in every case. Each entry has
  two more fields: ``module``, the submodule of the decoder layer running when it was packed
  ("self_attn.q_proj", "mlp.gate", "mlp.experts", ...; "" for the layer's own code), and ``saved_by``,
  the backward nodes of the graph that hold the storage (e.g. ``MmBackward0``, ``SoftmaxBackward0``);
  ``saved_by`` is left empty under checkpointing (reading a checkpointed node's saved tensors would
  recompute the block).
* ``block_bytes_by_part``: per block, the saved bytes (activation + weight_copy, storages first saved by
  that block) split by module: attention (self_attn), norms (input/post-attention layernorms), router
  (mlp.gate), experts (mlp.experts), shared_expert (shared_expert and shared_expert_gate), mlp (the
  sparse block's own code: the shared expert's sigmoid product; in the dense reference the whole MLP),
  layer (the decoder layer's own code). A storage goes to the module that packed it first: Qwen2-MoE's
  MLP input is the shared expert's (it runs before the router), Mixtral's the router's.
* ``checks`` (top level): for every case without checkpointing, the attention + norms bytes of block 1
  against those of transformers' dense ``LlamaForCausalLM`` of the same attention shape (the config
  ``llama-equivalent-h64``, measured the same way, not written as a case): Mixtral equals it; Qwen3-MoE
  and OLMoE add their q_norm/k_norm; Qwen2-MoE's q/k/v biases save nothing more.
* Top level as in oracle_units.json (schema_version, generated_by, command, versions, configs, shapes,
  cases, dropped), plus ``seeds``, ``torch_threads``, ``reference_configs``, ``checks`` and ``seconds``
  (the run's wall time). Each saved-tensor entry is written on one line.

CPU measurement, GPU questions
------------------------------
* SDPA on CPU runs ``_scaled_dot_product_flash_attention_for_cpu`` (output and fp32 logsumexp saved), as
  in measure_units.py.
* ``grouped_mm`` is one ATen op on CPU and CUDA (SM80+), with one autograd formula (GroupedMmBackward0
  saves both operands and the offsets). transformers' ``_grouped_mm`` casts the input to the weights' dtype
  on any device; whether CUDA's kernel accepts fp32 operands under autocast was not checked here.
* The eager loop's per-expert shapes depend on the routing, which depends on the random init and token
  ids: the seeds are fixed (``seeds`` in the output).

Run (the python of the frameworks venv that scripts/frameworks-env.sh makes, build/frameworks):
``python validation/measure_moe_units.py --out tests/costmodel/data/oracle_moe_units.json``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure_units as mu  # noqa: E402  (builders, recorder, classifier, unit summary, writer)

GENERATED_BY = "validation/measure_moe_units.py"
SHAPES = [(128, 1), (128, 2), (256, 1), (256, 2)]  # (seq_len, micro_batch)
SEEDS = {"model_init": 0, "input_ids": 1,
         "input_ids_rule": "torch.manual_seed(1); torch.randint(0, vocab_size, (micro_batch, seq_len))"}

_COMMON = {
    "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "num_hidden_layers": 2, "vocab_size": 128, "max_position_embeddings": 256, "hidden_act": "silu",
    "rope_theta": 10000.0, "attention_dropout": 0.0, "tie_word_embeddings": False,
    "num_experts_per_tok": 2, "output_router_logits": False,
    "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": None,
}
CONFIGS = {
    "mixtral-h64-e8": dict(_COMMON, architectures=["MixtralForCausalLM"], model_type="mixtral",
                           intermediate_size=32, num_local_experts=8, rms_norm_eps=1e-05,
                           router_jitter_noise=0.0, sliding_window=None),
    "qwen3-moe-h64-e8": dict(_COMMON, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                             intermediate_size=32, moe_intermediate_size=32, num_experts=8,
                             norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
                             rms_norm_eps=1e-06, use_sliding_window=False, attention_bias=False),
    "olmoe-h64-e8": dict(_COMMON, architectures=["OlmoeForCausalLM"], model_type="olmoe",
                         intermediate_size=32, num_experts=8, norm_topk_prob=False, rms_norm_eps=1e-05,
                         attention_bias=False, clip_qkv=None),
    "qwen2-moe-h64-e8": dict(_COMMON, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe",
                             intermediate_size=32, moe_intermediate_size=32,
                             shared_expert_intermediate_size=48, num_experts=8, norm_topk_prob=False,
                             decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-06,
                             use_sliding_window=False, qkv_bias=True),
}
# The dense block with the same attention (the reference of ``checks``; its MLP width is irrelevant there).
LLAMA_EQUIVALENT = "llama-equivalent-h64"
REFERENCE_CONFIGS = {
    LLAMA_EQUIVALENT: {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 32, "vocab_size": 128, "num_hidden_layers": 2,
        "max_position_embeddings": 256, "hidden_act": "silu", "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0, "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 0,
    }
}
mu.CONFIGS.update(CONFIGS)            # build_hf_model reads its configs from measure_units.CONFIGS
mu.CONFIGS.update(REFERENCE_CONFIGS)

MODELS = [  # (config name, HF class)
    ("mixtral-h64-e8", "MixtralForCausalLM"),
    ("qwen3-moe-h64-e8", "Qwen3MoeForCausalLM"),
    ("olmoe-h64-e8", "OlmoeForCausalLM"),
    ("qwen2-moe-h64-e8", "Qwen2MoeForCausalLM"),
]
TENSOR_LIST_UNIT = "block 1"  # the block whose saved-tensor list every case carries (see the docstring)
DEFAULT_EXPERTS = "default"  # resolved by transformers at build time (recorded as the name it resolved to)
OTHER_EXPERTS = ("eager", "batched_mm")
GEMM_NODES = ("GroupedMm", "MmBackward", "BmmBackward", "AddmmBackward", "GroupedMmFallback",
              "grouped_mm")


def case_plan():
    groups = []
    for config, cls in MODELS:
        for precision in ("fp32", "bf16-mixed"):
            for attention in ("flash", "eager"):
                for ckpt in ("none", "full"):
                    groups.append(dict(recipe="hf", config=config, model_class=cls, precision=precision,
                                       attention=attention, checkpointing=ckpt, loss="upcast",
                                       experts=DEFAULT_EXPERTS))
        for experts in OTHER_EXPERTS:
            for precision in ("fp32", "bf16-mixed"):
                groups.append(dict(recipe="hf", config=config, model_class=cls, precision=precision,
                                   attention="flash", checkpointing="none", loss="upcast",
                                   experts=experts))
    return groups


def case_id(group, impl, seq_len, batch):
    """measure_units' id with the experts implementation before the shape:
    hf/MixtralForCausalLM-h64-e8/fp32/flash/upcast/none/grouped_mm/s128-b1."""
    base = mu.case_id(group, seq_len, batch)
    head, shape = base.rsplit("/", 1)
    return f"{head}/{impl}/{shape}"


# --------------------------------------------------------------------------------------------------
# Recording: measure_units' recorder plus the submodule running at each pack.
# --------------------------------------------------------------------------------------------------

class ModuleAwareRecorder(mu.SavedTensorRecorder):
    """SavedTensorRecorder that also notes, per packed tensor, the decoder-layer submodule then running."""

    def __init__(self):
        super().__init__()
        self.stack = []    # submodule paths (relative to their decoder layer), innermost last
        self.modules = []  # parallel to self.events

    def pack(self, t):
        self.modules.append(self.stack[-1] if self.stack else "")
        return super().pack(t)


def install_module_tracking(recorder, layers):
    """Forward pre-hooks push a decoder-layer submodule's path, forward hooks pop it (returning None: a
    forward hook's return value would replace the module's output)."""
    def enter(name):
        def hook(*_):
            recorder.stack.append(name)
        return hook

    def leave(name):
        def hook(*_):
            if recorder.stack and recorder.stack[-1] == name:
                recorder.stack.pop()
        return hook

    handles = []
    for layer in layers:
        for name, sub in layer.named_modules():
            if name:
                handles.append(sub.register_forward_pre_hook(enter(name)))
                handles.append(sub.register_forward_hook(leave(name)))
    return handles


class RoutingRecorder:
    """Forward hooks on each layer's router (mlp.gate): the first call is the measured forward; later calls
    are checkpointing's recompute in backward."""

    def __init__(self, layers):
        self.calls = {i: [] for i in range(len(layers))}
        self.handles = [layer.mlp.gate.register_forward_hook(self._hook(i)) for i, layer in enumerate(layers)]

    def _hook(self, i):
        def hook(module, args, output):
            logits, weights, indices = output
            self.calls[i].append({"logits": logits, "weights": weights.detach(),
                                  "indices": indices.detach().clone(), "top_k": int(module.top_k),
                                  "num_experts": int(module.num_experts)})
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def storage_key(t):
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


def saved_by_nodes(root):
    """storage key -> names of the backward nodes that hold a tensor of that storage (walking the graph from
    the loss; reading ``_saved_*`` goes through the identity unpack hook)."""
    out, seen, todo = {}, set(), [root]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        values = []
        for attr in dir(fn):
            if attr.startswith("_saved_"):
                try:
                    values.append(getattr(fn, attr))
                except Exception:
                    pass
        if hasattr(fn, "saved_tensors"):  # custom autograd.Function ctx
            try:
                values.append(fn.saved_tensors)
            except Exception:
                pass
        for v in values:
            for t in (v if isinstance(v, (tuple, list)) else (v,)):
                if isinstance(t, torch.Tensor):
                    k = storage_key(t)
                    if k is not None:
                        out.setdefault(k, set()).add(fn.name())
        todo.extend(f for f, _ in fn.next_functions)
    return out


# --------------------------------------------------------------------------------------------------
# Classification: measure_units' classifier, plus autocast's per-expert weight casts.
# --------------------------------------------------------------------------------------------------

class MoeStorageClassifier(mu.StorageClassifier):
    """A 16-bit cast of one expert's slice of a 3-D expert weight (``gate_up_proj[e]`` cast by F.linear under
    autocast in the eager loop) is a weight copy too; measure_units' classifier only follows casts and
    views, not the ``select`` that picks the expert."""

    def kind(self, t, key):
        k = super().kind(t, key)
        if k != "activation" or t.dtype not in mu.SIXTEEN_BIT:
            return k
        fn, steps = t.grad_fn, 0
        while fn is not None and steps < 6:
            if fn.name() == "torch::autograd::AccumulateGrad":
                p = fn.variable
                if p.dim() == 3 and tuple(p.shape[1:]) in (tuple(t.shape), tuple(t.shape)[::-1]):
                    return "weight_copy"
                return k
            if fn.name() not in mu.PASS_THROUGH | {"SelectBackward0"}:
                return k
            nxt = [f for f, _ in fn.next_functions if f is not None]
            if len(nxt) != 1:
                return k
            fn, steps = nxt[0], steps + 1
        return k


# --------------------------------------------------------------------------------------------------
# One case.
# --------------------------------------------------------------------------------------------------

PARTS = [("self_attn", "attention"), ("input_layernorm", "norms"), ("post_attention_layernorm", "norms"),
         ("mlp.gate", "router"), ("mlp.experts", "experts"), ("mlp.shared_expert_gate", "shared_expert"),
         ("mlp.shared_expert", "shared_expert"), ("mlp", "mlp")]


def part_of(module):
    for prefix, part in PARTS:
        if module == prefix or module.startswith(prefix + "."):
            return part
    return "layer"


def build_model(group):
    model = mu.build_hf_model(group)
    if group.get("experts", DEFAULT_EXPERTS) != DEFAULT_EXPERTS:
        model.set_experts_implementation(group["experts"])
    return model


def annotate_tensors(units, recorder, holders):
    """Adds ``module`` and ``saved_by`` to every tensor entry; returns the blocks' bytes by part and the
    experts' GEMM node names. Per unit, the i-th entry is the i-th distinct storage the unit packed
    (summarise_units' order)."""
    first_module = {}
    for (unit, _, key, _), module in zip(recorder.events, recorder.modules):
        first_module.setdefault((unit, key), module)
    experts_kernels, parts = set(), {}
    for name, summary in units.items():
        keys = list(dict.fromkeys(k for u, _, k, _ in recorder.events if u == name))
        assert len(keys) == len(summary["tensors"]), name
        block = name.startswith("block")
        by_part = {}
        for key, entry in zip(keys, summary["tensors"]):
            entry["module"] = first_module[(name, key)] if block else ""
            entry["saved_by"] = sorted(holders.get(key, ()))
            new_memory = entry["kind"] in ("activation", "weight_copy")
            if block and new_memory and not entry["shared_with_earlier_unit"]:
                part = part_of(entry["module"])
                by_part[part] = by_part.get(part, 0) + entry["bytes"]
            if entry["module"].startswith("mlp.experts"):
                experts_kernels.update(n for n in [entry["grad_fn"] or ""] + entry["saved_by"]
                                       if any(g in n for g in GEMM_NODES))
        if block:
            parts[name] = by_part
    return parts, sorted(experts_kernels)


def routing_facts(routing, saved_keys, tokens, output_router_logits):
    """Per block, the first router call's routing (the measured forward); later calls are checkpointing's
    recompute in backward."""
    routes = {}
    for i, calls in routing.calls.items():
        first = calls[0]
        counts = torch.bincount(first["indices"].reshape(-1), minlength=first["num_experts"]).tolist()
        if sum(counts) != first["top_k"] * tokens:
            raise RuntimeError(f"routing of block {i}: {sum(counts)} pairs for {tokens} tokens")
        routes[f"block {i}"] = {
            "tokens": tokens, "top_k": first["top_k"], "num_experts": first["num_experts"],
            "tokens_per_expert": counts, "routed_pairs": int(sum(counts)),
            "sum_is_top_k_times_tokens": True,
            "experts_hit": sum(1 for c in counts if c > 0),
            "router_logits_shape": list(first["logits"].shape),
            "router_logits_dtype": str(first["logits"].dtype).replace("torch.", ""),
            "top_k_weights_dtype": str(first["weights"].dtype).replace("torch.", ""),
            "router_logits_saved": storage_key(first["logits"]) in saved_keys,
            "router_logits_returned": bool(output_router_logits),
            "router_forward_calls": len(calls),
            "recompute_routing_identical": (
                all(torch.equal(c["indices"], first["indices"]) for c in calls[1:])
                if len(calls) > 1 else None),
        }
    return routes


def measure_case(group, seq_len, batch, model, all_tensor_lists):
    """measure_units.measure_case for the hf recipe, with the module of each saved tensor, the backward nodes
    that hold it, and the routing of every block. Tensor lists: every unit's if all_tensor_lists, else
    TENSOR_LIST_UNIT's only."""
    recorder = ModuleAwareRecorder()
    layers, norm = mu.hf_parts(model)
    handles = mu.install_unit_markers(recorder, layers, norm) + install_module_tracking(recorder, layers)
    routing = RoutingRecorder(layers) if hasattr(layers[0].mlp, "gate") else None
    classifier = MoeStorageClassifier(model)
    loss, logits = mu.run_hf(model, group, seq_len, batch, recorder)
    units = mu.summarise_units(recorder, classifier, len(layers), True)
    kernel = mu.attention_kernel(recorder, group["attention"])
    for h in handles:
        h.remove()
    holders = saved_by_nodes(loss.grad_fn) if group["checkpointing"] == "none" else {}
    parts, experts_kernels = annotate_tensors(units, recorder, holders)
    if not all_tensor_lists:
        for name, summary in units.items():
            if name != TENSOR_LIST_UNIT:
                del summary["tensors"]
    saved_keys = {k for _, _, k, _ in recorder.events}

    loss.backward()  # with checkpointing, the router's hook sees the recompute too
    if not any(p.grad is not None for p in model.parameters()):
        raise RuntimeError("backward produced no gradient")
    model.zero_grad(set_to_none=True)
    output_router_logits = getattr(model.config, "output_router_logits", None)
    routes = {}
    if routing is not None:
        routes = routing_facts(routing, saved_keys, seq_len * batch, output_router_logits)
        routing.remove()

    # transformers resolves a model without experts to "eager" too: only MoE models carry the field.
    impl = getattr(model.config, "_experts_implementation", None) if routing is not None else None
    record = {k: v for k, v in group.items() if k != "experts"}
    record.update({
        "id": case_id(group, impl, seq_len, batch) if impl else mu.case_id(group, seq_len, batch),
        "seq_len": seq_len, "micro_batch": batch,
        "attn_implementation": model.config._attn_implementation,
        "experts_implementation": impl, "experts_implementation_requested": group.get("experts"),
        "experts_kernels": experts_kernels,
        "attention_kernel": kernel, "units": units, "block_bytes_by_part": parts,
        "routing": routes, "output_router_logits": output_router_logits,
        "logits_alive_bytes": int(logits.untyped_storage().nbytes()),
        "model_output_bytes": int(logits.untyped_storage().nbytes()),
        "mixed_precision_mechanism": "none" if group["precision"] == "fp32" else "autocast",
        "backward_ok": True,
    })
    return record


def run_group(group):
    model = build_model(group)
    return [measure_case(group, s, b, model, i == 0) for i, (s, b) in enumerate(SHAPES)]


def reference_checks(cases):
    """Attention + norms bytes of each MoE case's block 1 against the dense Llama block of the same
    attention shape (block 1: block 0 also keeps the rotary cos/sin the blocks share)."""
    ref = {}
    for precision in ("fp32", "bf16-mixed"):
        for attention in ("flash", "eager"):
            group = dict(recipe="hf", config=LLAMA_EQUIVALENT, model_class="LlamaForCausalLM",
                         precision=precision, attention=attention, checkpointing="none", loss="upcast")
            for rec in run_group(group):
                ref[(precision, attention, rec["seq_len"], rec["micro_batch"])] = rec
    checks = []
    for c in cases:
        if c["checkpointing"] != "none":
            continue
        r = ref[(c["precision"], c["attention"], c["seq_len"], c["micro_batch"])]
        dense = r["block_bytes_by_part"]["block 1"]
        moe = c["block_bytes_by_part"]["block 1"]
        d = dense.get("attention", 0) + dense.get("norms", 0)
        m = moe.get("attention", 0) + moe.get("norms", 0)
        checks.append({"case": c["id"], "reference": r["id"], "dense_attention_and_norms_bytes": d,
                       "moe_attention_and_norms_bytes": m, "difference_bytes": m - d,
                       "dense_block_bytes": r["units"]["block 1"]["activation_bytes"]
                       + r["units"]["block 1"]["weight_copy_bytes"],
                       "dense_block_bytes_by_part": dense})
    return checks


def versions():
    import transformers
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--only", default=None,
                        help="debugging: run only the case groups whose id contains one of these "
                             "comma-separated texts")
    args = parser.parse_args()

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    warnings.filterwarnings("ignore")
    start = time.time()
    cases, dropped = [], []
    for group in case_plan():
        gid = case_id(group, group["experts"], 0, 0)
        if args.only and not any(t in gid for t in args.only.split(",")):
            continue
        t0 = time.time()
        try:
            records = run_group(group)
        except Exception as e:
            dropped.append({"group": group, "error": f"{type(e).__name__}: {e}"})
            print(f"DROPPED {group}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        cases.extend(records)
        print(f"{records[0]['id'].rsplit('/', 1)[0]}: {len(records)} shapes, {time.time() - t0:.1f} s, "
              f"kernel {records[0]['attention_kernel']}, experts {records[0]['experts_kernels']}",
              file=sys.stderr)
    mu.fill_missing_kernels(cases)
    checks = reference_checks(cases)

    out = {
        "schema_version": 1,
        "generated_by": GENERATED_BY,
        "command": "python validation/measure_moe_units.py --out " + mu.repo_relative(args.out)
                   + (f" --only {args.only}" if args.only else ""),
        "versions": versions(),
        "seeds": SEEDS,
        "torch_threads": torch.get_num_threads(),
        "configs": {name: dict(cfg) for name, cfg in CONFIGS.items()},
        "reference_configs": REFERENCE_CONFIGS,
        "shapes": [{"seq_len": s, "micro_batch": b} for s, b in SHAPES],
        "cases": cases,
        "checks": checks,
        "dropped": dropped,
        "seconds": round(time.time() - start, 1),
    }
    write_json(args.out, out, f"{len(cases)} cases, {len(dropped)} groups dropped", start)


def write_json(path, out, summary, start):
    """measure_units.write_corpus_json's layout (sorted keys, one space of indent), except that each saved
    tensor entry takes one line (the per-tensor lists of every case would triple the file otherwise)."""
    lines = {}
    for c in out["cases"]:
        for unit in c["units"].values():
            for i, entry in enumerate(unit.get("tensors", [])):
                marker = f"@@tensor{len(lines)}@@"
                lines[marker] = json.dumps(entry, sort_keys=True)
                unit["tensors"][i] = marker
    text = json.dumps(out, indent=1, sort_keys=True)
    text = re.sub(r'"(@@tensor\d+@@)"', lambda m: lines[m.group(1)], text)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text + "\n")
    print(f"{summary}, {time.time() - start:.0f} s, {os.path.getsize(path)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
