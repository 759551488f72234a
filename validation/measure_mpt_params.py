#!/usr/bin/env python3
"""Parameter counts of llm-foundry's own MPT (llmfoundry.models.mpt.MPTForCausalLM), per unit, for the
MPT config.json files the planner reads: tests/documents/data/mpt_params.json.

Each case is an MPT config.json (the keys llm-foundry's MPTConfig reads, tiny sizes); the model is built
on CPU (init_device "cpu") and its named parameters are summed per unit as the planner splits a model:
``embedding`` (transformer.wte, transformer.wpe), ``block`` (transformer.blocks.0.*; every block is
the same), ``head`` (transformer.norm_f, lm_head), plus the total. llm-foundry's MPTConfig is built from
the same dict the planner reads (``MPTConfig(**config)``), so defaults are llm-foundry's own. The
config recorded is the dict as MPTConfig leaves it: it fills the attn_config and ffn_config it is
handed with its defaults (and copies fc_type into ffn_config), as its save_pretrained writes them
into an exported config.json; a case that hands it none records none.

Usage (llm-foundry 0.22.0 from PyPI pins torch 2.7.0 and transformers 4.51.3, so it gets a venv of its
own): python3 -m venv validation/.venv-llm-foundry &&
validation/.venv-llm-foundry/bin/pip install -r validation/requirements-llm-foundry.txt &&
validation/.venv-llm-foundry/bin/python validation/measure_mpt_params.py --out tests/documents/data/mpt_params.json
(a few seconds on CPU).
"""
import argparse
import importlib.metadata
import json
import logging
import warnings

BASE = {"architectures": ["MPTForCausalLM"], "model_type": "mpt", "d_model": 64, "n_heads": 4,
        "n_layers": 2, "expansion_ratio": 4, "max_seq_len": 32, "vocab_size": 128}


def case(name, **changes):
    config = json.loads(json.dumps(BASE))
    for key, value in changes.items():
        config[key] = value
    return name, config


# The switches that change shapes: the FFN (MLP, GLU, explicit width), the attention (MHA, GQA, MQA,
# head_dim, qk_ln, separate q/k/v, a QKV bias without other biases), biases, norms, positions
# (learned, ALiBi, rotary) and tied or separate output layer.
CASES = [
    case("mpt-default"),
    case("mpt-glu", ffn_config={"ffn_type": "mptglu", "ffn_act_fn": {"name": "silu"}}),
    case("mpt-ffn-width", ffn_config={"ffn_type": "mptmlp", "ffn_hidden_size": 96}),
    case("mpt-gqa", attn_config={"attn_type": "grouped_query_attention", "kv_n_heads": 2}),
    case("mpt-mqa", attn_config={"attn_type": "multiquery_attention"}),
    case("mpt-head-dim", head_dim=8),
    case("mpt-qk-ln", attn_config={"qk_ln": True, "attn_type": "grouped_query_attention",
                                   "kv_n_heads": 2}),
    case("mpt-unfused-qkv", attn_config={"fused_qkv": False}),
    case("mpt-no-bias", no_bias=True),
    case("mpt-qkv-bias-only", no_bias=True, attention_bias=True),
    case("mpt-rmsnorm", norm_type="rmsnorm", no_bias=True),
    case("mpt-lp-rmsnorm", norm_type="low_precision_rmsnorm"),
    case("mpt-layernorm", norm_type="layernorm"),
    # ALiBi under attn_impl "flash" needs flash-attn (CUDA); attn_impl changes no shape, so "torch".
    case("mpt-alibi", attn_config={"alibi": True, "attn_impl": "torch"}),
    case("mpt-rope", attn_config={"rope": True, "rope_impl": "hf"}),
    case("mpt-untied", tie_word_embeddings=False),
    case("mpt-7b-like", no_bias=True, attn_config={"alibi": True, "attn_impl": "torch"},
         expansion_ratio=4, learned_pos_emb=False),
]


def count(config):
    from llmfoundry.models.mpt import MPTConfig, MPTForCausalLM
    keys = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    model = MPTForCausalLM(MPTConfig(init_device="cpu", **keys))
    units = {"embedding": 0, "block": 0, "head": 0}
    for name, p in model.named_parameters():
        if name.startswith(("transformer.wte.", "transformer.wpe.")):
            units["embedding"] += p.numel()
        elif name.startswith("transformer.blocks.0."):
            units["block"] += p.numel()
        elif name.startswith(("transformer.norm_f.", "lm_head.")):
            units["head"] += p.numel()
        elif not name.startswith("transformer.blocks."):
            raise RuntimeError(f"parameter {name} belongs to no unit")
    units["total"] = sum(p.numel() for p in model.parameters())
    return units


def output_path(doc):
    """The --out argument of a measuring script, with llm-foundry's warnings and logs silenced."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    return args.out


def write_corpus(out, script, corpus, **fields):
    """Writes a corpus with the versions it was measured with and the command that rewrites it
    (`corpus`: its path in the repository)."""
    versions = {p: importlib.metadata.version(p) for p in ("llm-foundry", "torch", "transformers")}
    doc = {"schema_version": 1, "generated_by": f"validation/{script}",
           "command": f"python validation/{script} --out {corpus}", "versions": versions, **fields}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


def main():
    out = output_path(__doc__)
    cases = [{"id": name, "config": config, "params": count(config)} for name, config in CASES]
    write_corpus(out, "measure_mpt_params.py", "tests/documents/data/mpt_params.json", cases=cases)


if __name__ == "__main__":
    main()
