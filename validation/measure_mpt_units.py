#!/usr/bin/env python3
"""Bytes llm-foundry's own MPT block keeps for backward, per block: tests/costmodel/data/oracle_mpt_units.json.

For each case (config x precision x shape) the script builds llm-foundry's MPTForCausalLM on CPU
(torch.manual_seed(0), train mode), feeds random token ids [b, s] and runs the forward of the
transformer (MPTModel: embeddings and blocks; the head and the loss are not measured here) inside
``torch.autograd.graph.saved_tensors_hooks``. Every storage a block's autograd nodes save is counted
once, in the unit that saved it first (each block's forward pre-hook starts it, the final norm's
ends the last), as validation/measure_units.py counts them, filed as ``parameter`` (a
parameter's own storage), ``weight_copy`` (a cast of one: autocast's weight casts) or
``activation``. A block's first saved tensor is its input, the previous unit's output.

On a CPU two things differ from CUDA, both in llm-foundry's and torch's own code: MPT's
low-precision norms downcast only under CUDA's autocast (norm.py, _cast_if_autocast_enabled asks
torch.is_autocast_enabled(), which is CUDA's), and CPU autocast leaves softmax in the compute
dtype where CUDA's runs it in fp32; a layer_norm of a bf16 input keeps bf16 statistics on a CPU
when its weights are bf16 (fp32 ones with fp32 weights: qk_ln's under bf16-full), fp32 on CUDA.
rope_impl "dail" needs flash-attn (CUDA), so the rotary configs run "hf". The cost model counts
both devices (costmodel/block_table.cpp, mpt_rows).

Precisions, as Composer runs llm-foundry (composer/distributed/mosaic_parallelism.py,
get_mixed_precision; composer/core/precision.py):
  fp32          no autocast, fp32 parameters
  bf16-full     ``torch.autocast(bf16)`` over fp32 parameters (amp_bf16 with FSDP's "FULL" or DDP)
  bf16-default  ``torch.autocast(bf16)`` over bf16 parameters (FSDP1's "DEFAULT": param_dtype bf16,
                the gathered parameters in bf16; emulated here by the parameters cast to bf16)
The attention runs ``attn_impl: torch`` (llm-foundry's scaled_multihead_dot_product_attention:
its eager scores); ``flash`` needs flash-attn's CUDA kernels.

Usage (llm-foundry 0.22.0 from PyPI pins torch 2.7.0 and transformers 4.51.3, so it gets a venv of
its own): python3 -m venv validation/.venv-llm-foundry &&
validation/.venv-llm-foundry/bin/pip install -r validation/requirements-llm-foundry.txt &&
validation/.venv-llm-foundry/bin/python validation/measure_mpt_units.py --out tests/costmodel/data/oracle_mpt_units.json
(under a minute on CPU).
"""
import json

import torch

from measure_mpt_params import output_path, write_corpus

BASE = {"architectures": ["MPTForCausalLM"], "model_type": "mpt", "d_model": 64, "n_heads": 4,
        "n_layers": 2, "expansion_ratio": 4, "max_seq_len": 128, "vocab_size": 128,
        "attn_config": {"attn_impl": "torch"}}


def config(**changes):
    c = json.loads(json.dumps(BASE))
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(c.get(key), dict):
            c[key].update(value)
        else:
            c[key] = value
    return c


CONFIGS = {
    "mpt-h64": config(),
    "mpt-h64-nobias": config(no_bias=True),
    "mpt-h64-glu": config(ffn_config={"ffn_type": "mptglu", "ffn_act_fn": {"name": "silu"}}),
    "mpt-h64-gqa": config(attn_config={"attn_type": "grouped_query_attention", "kv_n_heads": 2}),
    "mpt-h64-rmsnorm": config(norm_type="low_precision_rmsnorm", no_bias=True),
    "mpt-h64-alibi": config(attn_config={"alibi": True}),
    "mpt-h64-mqa": config(attn_config={"attn_type": "multiquery_attention"}),
    "mpt-h64-dropout": config(resid_pdrop=0.1, emb_pdrop=0.1, attn_config={"attn_pdrop": 0.1}),
    # grouped_query_attention with one KV head: the multi-query path through GroupedQueryAttention
    # (MultiQueryAttention above is the same class with kv_n_heads 1).
    "mpt-h64-gqa-kv1": config(attn_config={"attn_type": "grouped_query_attention",
                                           "kv_n_heads": 1}),
    # Rotary embeddings replace the learned positions (MPTConfig._validate_config sets
    # learned_pos_emb false under rope; written out here as the model runs). rope_impl "dail" is
    # refused without flash-attn >= 2.0.1 (CUDA), so only "hf" (transformers' LlamaRotaryEmbedding,
    # rope_theta 10000, rope_hf_config no_scaling) is measured.
    "mpt-h64-rope-hf": config(learned_pos_emb=False, attn_config={"rope": True, "rope_impl": "hf"}),
    "mpt-h64-qkln": config(attn_config={"qk_ln": True}),
    "mpt-h64-qkgn": config(attn_config={"qk_gn": True}),
    "mpt-h64-clip": config(attn_config={"clip_qkv": 8.0}),
    # Llama-like: GQA, rotary (hf, as above), SwiGLU, RMSNorm, no biases.
    "mpt-h64-gqa-rope-hf": config(
        learned_pos_emb=False, no_bias=True, norm_type="low_precision_rmsnorm",
        ffn_config={"ffn_type": "mptglu", "ffn_act_fn": {"name": "silu"}},
        attn_config={"attn_type": "grouped_query_attention", "kv_n_heads": 2, "rope": True,
                     "rope_impl": "hf"}),
}
PRECISIONS = ["fp32", "bf16-full", "bf16-default"]
SHAPES = [(32, 1), (64, 2)]


def build(cfg):
    from llmfoundry.models.mpt import MPTConfig, MPTForCausalLM
    torch.manual_seed(0)
    keys = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type")}
    model = MPTForCausalLM(MPTConfig(init_device="cpu", **keys))
    model.train()
    return model


def weight_copy(t, params):
    """A cast of a parameter (autocast's weight casts, the low-precision norms' downcasts): its
    history leads through casts, transposes and views to the parameter's AccumulateGrad."""
    fn, steps = t.grad_fn, 0
    while fn is not None and steps < 4:
        if type(fn).__name__ == "AccumulateGrad":
            return fn.variable.untyped_storage()._cdata in params
        nxt = [f for f, _ in fn.next_functions if f is not None]
        if len(nxt) != 1 or type(fn).__name__ not in (
                "ToCopyBackward0", "TBackward0", "ViewBackward0", "PermuteBackward0"):
            return False
        fn, steps = nxt[0], steps + 1
    return False


def measure(model, precision, seq, batch):
    if precision == "bf16-default":
        model = model.to(torch.bfloat16)
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    blocks = list(model.transformer.blocks)
    current = ["embedding"]
    seen = {}
    kept = []

    def pack(t):
        kept.append(t)
        key = t.untyped_storage()._cdata
        if key not in seen:
            kind = ("parameter" if key in params else
                    "weight_copy" if weight_copy(t, params) else "activation")
            seen[key] = (current[0], t.untyped_storage().nbytes(), kind)
        return t

    for i, block in enumerate(blocks):
        block.register_forward_pre_hook(lambda m, a, i=i: current.__setitem__(0, f"block {i}"))
    model.transformer.norm_f.register_forward_pre_hook(
        lambda m, a: current.__setitem__(0, "final norm"))
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "fp32")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        out = model.transformer(input_ids=ids).last_hidden_state
    out.float().sum().backward()  # the graph works
    units = {}
    for unit, nbytes, kind in seen.values():
        u = units.setdefault(unit, {"activation_bytes": 0, "parameter_bytes": 0,
                                    "weight_copy_bytes": 0})
        u[kind + "_bytes"] += nbytes
    return units


def main():
    out = output_path(__doc__)
    cases = []
    for name, cfg in CONFIGS.items():
        for precision in PRECISIONS:
            for seq, batch in SHAPES:
                units = measure(build(cfg), precision, seq, batch)
                cases.append({"id": f"{name}/{precision}/s{seq}-b{batch}", "config": name,
                              "precision": precision, "seq_len": seq, "micro_batch": batch,
                              "units": units})
    write_corpus(out, "measure_mpt_units.py", "tests/costmodel/data/oracle_mpt_units.json",
                 configs=CONFIGS, cases=cases)


if __name__ == "__main__":
    main()
