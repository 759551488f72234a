#!/usr/bin/env python3
"""Measure the memory of whole training steps of transformers' mixture-of-experts models.

What it measures
    validation/measure_steps.py's step (imported, not copied: its model builder's conventions,
    batch, wrappers, foreach AdamW, trackers, the DDP bucket category, the optimizer_temp split,
    the two FSDP2-on-gloo corrections of validation/fsdp2_on_gloo.py, the torchrun launcher and
    the rank merge) for four MoE causal LMs of transformers 5.23:

    - ``MixtralForCausalLM`` ("mixtral-h256-e8");
    - ``Qwen2MoeForCausalLM`` ("qwen2-moe-h256-e8"), with a shared expert behind a sigmoid
      ``shared_expert_gate``;
    - ``Qwen3MoeForCausalLM`` ("qwen3-moe-h256-e8"), with q_norm/k_norm per head (RMSNorms of
      head_dim 32) and no shared expert;
    - ``OlmoeForCausalLM`` ("olmoe-h256-e8"), with q_norm/k_norm over the whole projections
      (RMSNorms of 256 and 64; OLMoE requires head_dim = hidden / heads, which holds).

    All four keep measure_steps' dense "llama-h256" shape (hidden 256, 8 heads over 2 key/value
    heads, 4 layers, vocab 4096, 2048 positions, untied embeddings), so dense and MoE cases compare:
    every decoder layer is sparse, with 8 experts, top-2, expert width 352 (half of llama-h256's
    704, a multiple of 8; Mixtral's and OLMoE's key for it is ``intermediate_size``, the Qwen
    configs' ``moe_intermediate_size``, their ``intermediate_size``, the width of dense layers,
    unused where every layer is sparse, being llama-h256's 704); Qwen2-MoE's shared expert is
    704 wide. Dropout 0, no router jitter, ``output_router_logits`` False (no auxiliary loss),
    use_cache False; OLMoE's pad_token_id (1) and eos_token_id (50279, outside the vocabulary) are
    set to None, as the Qwen configs default (so no embedding padding_idx). The rest are the config
    classes' defaults (Mixtral: rope_theta 1e6, top-k renormalized; Qwen2-MoE: q/k/v biases,
    ``norm_topk_prob`` False, no sliding window; Qwen3-MoE and OLMoE: no attention biases,
    ``norm_topk_prob`` False, rope_theta 1e4; Qwen3-MoE: no sliding window; OLMoE: no q/k/v clip).

    The experts run transformers 5.23's default implementation: ``PreTrainedModel.__init__``
    resolves the unset ``config._experts_implementation`` to "grouped_mm" for the decorated
    ``<Arch>Experts`` on any device; each case records the name the built model resolved
    (``experts_implementation``). The expert weights are two fused 3-D parameters per layer,
    ``gate_up_proj`` [8, 704, 256] and ``down_proj`` [8, 256, 352], so DDP buckets and FSDP2
    shards (dim 0: four experts per rank at world 2) see whole expert stacks, and every expert
    gets a gradient (zeros where it got no token) each step.

    Grid: the four models x measure_steps' base grid (precision fp32 / bf16-mixed x checkpointing
    none / full x sequence 128 / 256 x micro-batch 1 / 2) x runs "none" w1, "ddp" w1, "ddp" w2,
    "fsdp2" w2: 256 cases, the whole grid, not cut (about 9 minutes on two cores at nice 19, the
    two reruns included). "bf16-mixed" is autocast for none/ddp and FSDP2's MixedPrecisionPolicy(bf16, fp32)
    for fsdp2, as in measure_steps.

What each case adds to measure_steps' record
    * ``experts_implementation``: ``model.config._experts_implementation`` as built.
    * ``experts_gemm_dtypes``: the grouped GEMM ops the tracker saw in the measured step, each
      with its operands' dtypes ("_grouped_mm:float32,float32"): under bf16 autocast
      transformers' ``_grouped_mm`` casts the input to the weight's dtype and the op is not on
      autocast's list, so the experts' GEMMs run in float32 against the float32 weights; under
      FSDP2's bf16 param_dtype they run in bf16.
    * ``router_logits_dtypes``: the dtypes of the router's logits in the measured forward.
    * ``routing``: per block ("block i"), from a forward hook on the router (``mlp.gate``, whose
      forward returns router_logits, top-k weights, top-k indices in 5.23),
      ``tokens_per_expert`` in the measured step's forward (rank 0's batch; sums to top_k x
      seq x micro-batch, checked) and, under checkpointing, ``recompute_same`` (whether the
      recompute in backward routed every token the same way). The hook reads the indices with
      ``tolist()``, which allocates no tensor the trackers could see (a case measured with and
      without the hook gives the same record; see ``determinism``).

    Routing depends on the seed-0 init and the batch (measure_steps' ``1000 + rank`` generator),
    both fixed. ``determinism`` (top level) reruns two cases in fresh processes after the grid, a
    Mixtral fp32 case without a process group (also without the router hook) and a Qwen2-MoE
    bf16-mixed checkpointed FSDP2 case, and compares peak_bytes, at_peak, routing and the loss
    with the grid's records.

Output
    The layout of tests/costmodel/data/oracle_steps.json (read unchanged by
    tests/planner/oracle_step_rows.cpp): schema_version, generated_by, command, versions,
    configs (the HF config.json dicts, ``to_diff_dict()`` of the config each model was built from,
    plus "architectures"), cases, failures; plus determinism and seconds (the run's wall time).

Usage (the python of the frameworks venv that scripts/frameworks-env.sh makes, build/frameworks):
    python validation/measure_moe_steps.py --out tests/costmodel/data/oracle_moe_steps.json
    (--planner PATH also checks that the planner parses each config to the same parameter count;
    --only none-w1 ... runs some wrapper-world runs; --no-determinism skips the reruns)
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure_steps as ms  # noqa: E402

GENERATED_BY = "validation/measure_moe_steps.py"
SCRIPT = os.path.abspath(__file__)
DEFAULT_OUT = "tests/costmodel/data/oracle_moe_steps.json"

_DENSE = ms.CONFIGS["llama-h256"]
_SHAPE = {k: _DENSE[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                 "num_key_value_heads", "vocab_size", "max_position_embeddings",
                                 "hidden_act", "rms_norm_eps", "attention_dropout",
                                 "tie_word_embeddings", "use_cache")}
NUM_EXPERTS = 8
TOP_K = 2
EXPERT_WIDTH = (_DENSE["intermediate_size"] // 2) // 8 * 8  # 352
SHARED_EXPERT_WIDTH = _DENSE["intermediate_size"]  # 704

# The configs as built (the corpus records each one's to_diff_dict() plus "architectures").
MOE_CONFIGS = {
    "mixtral-h256-e8": dict(
        _SHAPE, architectures=["MixtralForCausalLM"], model_type="mixtral",
        intermediate_size=EXPERT_WIDTH, num_local_experts=NUM_EXPERTS, num_experts_per_tok=TOP_K,
        router_jitter_noise=0.0, output_router_logits=False, sliding_window=None),
    "qwen2-moe-h256-e8": dict(
        _SHAPE, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe",
        intermediate_size=_DENSE["intermediate_size"], moe_intermediate_size=EXPERT_WIDTH,
        shared_expert_intermediate_size=SHARED_EXPERT_WIDTH, num_experts=NUM_EXPERTS,
        num_experts_per_tok=TOP_K, decoder_sparse_step=1, mlp_only_layers=[],
        norm_topk_prob=False, output_router_logits=False, use_sliding_window=False),
    "qwen3-moe-h256-e8": dict(
        _SHAPE, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
        intermediate_size=_DENSE["intermediate_size"], moe_intermediate_size=EXPERT_WIDTH,
        num_experts=NUM_EXPERTS, num_experts_per_tok=TOP_K, decoder_sparse_step=1,
        mlp_only_layers=[], norm_topk_prob=False, output_router_logits=False,
        use_sliding_window=False, attention_bias=False),
    "olmoe-h256-e8": dict(
        _SHAPE, architectures=["OlmoeForCausalLM"], model_type="olmoe",
        intermediate_size=EXPERT_WIDTH, num_experts=NUM_EXPERTS, num_experts_per_tok=TOP_K,
        norm_topk_prob=False, output_router_logits=False, attention_bias=False, clip_qkv=None,
        pad_token_id=None, eos_token_id=None),
}
ms.CONFIGS.update(MOE_CONFIGS)

GRID = "moe"
ms.GRIDS[GRID] = dict(ms.GRIDS["base"], configs=tuple(MOE_CONFIGS))
# The determinism reruns: (run, grid of one case); registered as grids so workers can run them.
DETERMINISM = (
    (("none", 1), "moe-check-none",
     {"configs": ("mixtral-h256-e8",), "precisions": ("fp32",), "checkpointing": ("none",),
      "seq_lens": (128,), "micro_batches": (1,)}),
    (("fsdp2", 2), "moe-check-fsdp2",
     {"configs": ("qwen2-moe-h256-e8",), "precisions": ("bf16-mixed",),
      "checkpointing": ("full",), "seq_lens": (256,), "micro_batches": (2,)}),
)
for _run, _grid, _g in DETERMINISM:
    ms.GRIDS[_grid] = _g
NO_ROUTER_HOOK_ENV = "MEASURE_MOE_NO_ROUTER_HOOK"  # set for the first determinism rerun


def config_class(arch):
    import transformers

    return {"MixtralForCausalLM": transformers.MixtralConfig,
            "Qwen2MoeForCausalLM": transformers.Qwen2MoeConfig,
            "Qwen3MoeForCausalLM": transformers.Qwen3MoeConfig,
            "OlmoeForCausalLM": transformers.OlmoeConfig}[arch]


def corpus_config(name):
    """The config.json dict of a config: to_diff_dict() of the config built from it, plus the
    architectures."""
    cfg = dict(ms.CONFIGS[name])
    arch = cfg.pop("architectures")
    cfg.pop("model_type")
    return {"architectures": arch, **config_class(arch[0])(**cfg).to_diff_dict()}


# ----------------------------------------------------------------------------------------------
# Routing and dispatch probes, installed through measure_steps' module globals


class _CaseState:
    """What the probes collect for the case being measured (one case at a time per process)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.measuring = False
        self.experts_implementation = None
        self.forward = {}    # block -> tokens per expert, the measured forward
        self.indices = {}    # block -> top-k indices (lists) of the measured forward
        self.recompute = {}  # block -> whether the recompute routed the same
        self.logits_dtypes = set()
        self.gemm = set()


STATE = _CaseState()


def router_hook(block):
    def hook(module, args, output):
        if not STATE.measuring:
            return None
        import torch

        logits, _weights, indices = output
        chosen = indices.tolist()  # no tensor allocated, nothing for the trackers to see
        if torch._C._current_graph_task_id() != -1:  # checkpointing's recompute in backward
            same = STATE.indices.get(block) == chosen
            STATE.recompute[block] = STATE.recompute.get(block, True) and same
            return None
        counts = [0] * module.num_experts
        for row in chosen:
            for e in row:
                counts[e] += 1
        STATE.forward[block] = counts
        STATE.indices[block] = chosen
        STATE.logits_dtypes.add(str(logits.dtype).replace("torch.", ""))
        return None
    return hook


_original_build_model = ms.build_model


def build_model(config_name, checkpointing):
    """measure_steps.build_model for the MoE configs (its own for the others), with the router
    hooks installed."""
    import warnings

    import torch
    import transformers

    if config_name not in MOE_CONFIGS:
        return _original_build_model(config_name, checkpointing)
    cfg = dict(ms.CONFIGS[config_name])
    arch = cfg.pop("architectures")[0]
    cfg.pop("model_type")
    config = config_class(arch)(**cfg)
    torch.manual_seed(0)
    model = getattr(transformers, arch)._from_config(
        config, attn_implementation="sdpa", dtype=torch.float32)
    if checkpointing == "full":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    STATE.experts_implementation = model.config._experts_implementation
    if not os.environ.get(NO_ROUTER_HOOK_ENV):
        for i, layer in enumerate(model.model.layers):
            layer.mlp.gate.register_forward_hook(router_hook(f"block {i}"))
    return model


_original_make_tracker = ms.make_tracker


def make_tracker(wrapper, model, optimizer, ids):
    """measure_steps.make_tracker; the measured step starts right after it."""
    tracker = _original_make_tracker(wrapper, model, optimizer, ids)
    STATE.measuring = True
    return tracker


_original_dispatch = ms._PeakProbe.__torch_dispatch__


def _probe_dispatch(self, func, types, args=(), kwargs=None):
    if STATE.measuring and "grouped_mm" in func.__name__:
        import torch

        dtypes = [str(a.dtype).replace("torch.", "") for a in args[:2]
                  if isinstance(a, torch.Tensor)]
        STATE.gemm.add(f"{func.__name__.split('.')[0]}:{','.join(dtypes)}")
    return _original_dispatch(self, func, types, args, kwargs)


_original_measure_case = ms.measure_case


def measure_case(wrapper, world_size, rank, case):
    """measure_steps.measure_case plus the experts' implementation, GEMM dtypes and routing."""
    STATE.reset()
    try:
        record = _original_measure_case(wrapper, world_size, rank, case)
    finally:
        STATE.measuring = False
    tokens = case["seq_len"] * case["micro_batch"]
    routing = {}
    for block, counts in sorted(STATE.forward.items(), key=lambda kv: int(kv[0].split()[1])):
        if sum(counts) != TOP_K * tokens:
            raise RuntimeError(f"{block}: {sum(counts)} routed tokens, expected {TOP_K * tokens}")
        routing[block] = {"tokens_per_expert": counts}
        if case["checkpointing"] == "full":
            routing[block]["recompute_same"] = STATE.recompute.get(block)
    loss = record.pop("loss_value")
    record.update(experts_implementation=STATE.experts_implementation,
                  experts_gemm_dtypes=sorted(STATE.gemm),
                  router_logits_dtypes=sorted(STATE.logits_dtypes),
                  routing=routing, loss_value=loss)
    return record


def install():
    ms.build_model = build_model
    ms.make_tracker = make_tracker
    ms.measure_case = measure_case
    ms._PeakProbe.__torch_dispatch__ = _probe_dispatch


# ----------------------------------------------------------------------------------------------
# Launcher: measure_steps' runs, with this script as the worker


def launch(wrapper, world_size, tmpdir, grid, env=None):
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        return ms.run_workers(SCRIPT, world_size, os.path.join(tmpdir, f"{grid}-{wrapper}-w{world_size}"),
                              ["--worker", wrapper, "--grid", grid], distributed=wrapper != "none")
    finally:
        os.environ.clear()
        os.environ.update(saved)


def check_determinism(cases):
    """Reruns two cases in fresh processes; compares them with the grid's records."""
    by_id = {c["id"]: c for c in cases}
    out = []
    with tempfile.TemporaryDirectory() as tmpdir:
        for (wrapper, world), grid, _ in DETERMINISM:
            env = {NO_ROUTER_HOOK_ENV: "1"} if wrapper == "none" else {}
            rc, files, log = launch(wrapper, world, tmpdir, grid, env)
            if rc != 0 or not all(os.path.exists(p) for p in files):
                out.append({"grid": grid, "error": f"exit {rc}, see the log"})
                continue
            merged, errors, _ = ms.merge_ranks(files)
            for rec in merged:
                first = by_id.get(rec["id"])
                entry = {"id": rec["id"], "router_hook": wrapper != "none",
                         "peak_bytes": [first and first["peak_bytes"], rec["peak_bytes"]],
                         "peak_bytes_range": [first and first["peak_bytes_range"],
                                              rec["peak_bytes_range"]]}
                if first:
                    entry["same_at_peak"] = first["at_peak"] == rec["at_peak"]
                    entry["same_loss"] = first["loss_value"] == rec["loss_value"]
                    if rec["routing"]:
                        entry["same_routing"] = first["routing"] == rec["routing"]
                    entry["identical"] = (entry["peak_bytes"][0] == entry["peak_bytes"][1]
                                          and entry["same_at_peak"] and entry["same_loss"]
                                          and entry.get("same_routing", True))
                out.append(entry)
            for k, v in errors.items():
                out.append({"id": k, "error": v})
    return out


def command_line(args):
    out = os.path.relpath(args.out)
    if out.startswith(".."):
        out = os.path.basename(out)
    parts = ["python", GENERATED_BY, "--out", out]
    for name in args.only or []:
        parts += ["--only", name]
    if args.no_determinism:
        parts.append("--no-determinism")
    return " ".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--only", action="append", choices=[f"{w}-w{n}" for w, n in ms.RUNS],
                    help="run only these wrapper-world runs (repeatable)")
    ap.add_argument("--planner", help="planner executable: check that it parses each config")
    ap.add_argument("--no-determinism", action="store_true", help="skip the two reruns")
    ap.add_argument("--grid", default=GRID, help=argparse.SUPPRESS)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    install()
    if args.worker:
        ms.worker_main(args.worker, args.worker_out.format(rank=os.environ.get("RANK", "0")),
                       args.grid)
        return 0

    started = time.time()
    cases, failures, warnings_ = ms.run_all(args.only, GRID, SCRIPT)
    configs = {name: corpus_config(name) for name in MOE_CONFIGS}
    determinism = [] if args.no_determinism else check_determinism(cases)
    problems = ms.check_planner(args.planner, cases, configs) if args.planner else []
    problems += [f"determinism: {d}" for d in determinism if not d.get("identical")]
    doc = {
        "schema_version": ms.SCHEMA_VERSION,
        "generated_by": GENERATED_BY,
        "command": command_line(args),
        "versions": ms.versions(),
        "configs": configs,
        "cases": cases,
        "failures": [{"id": k, "error": v} for k, v in sorted(failures.items())],
        "determinism": determinism,
        "seconds": round(time.time() - started),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    status = ms.report(args.out, cases, failures, warnings_, started)
    for d in determinism:
        print("DETERMINISM", json.dumps(d))
    for p in problems:
        print(f"PROBLEM {p}")
    return 1 if status or problems else 0


if __name__ == "__main__":
    sys.exit(main())
