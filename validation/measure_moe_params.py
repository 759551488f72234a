#!/usr/bin/env python3
"""Parameter counts of transformers' own mixture-of-experts causal LMs (Mixtral, Qwen2-MoE, Qwen3-MoE,
OLMoE, DeepSeek-V3), per unit, with the active parameters of a token, for the planner's MoE config
reader: tests/documents/data/moe_params.json.

Each case is a tiny config of one architecture, built with ``AutoConfig.for_model(model_type, **dict)``
and ``AutoModelForCausalLM.from_config`` on CPU (float32, every layer the same). Its named parameters are
summed per unit as the planner splits a model: ``embedding`` (model.embed_tokens), ``block``
(model.layers.0.*), ``head`` (model.norm, plus lm_head unless it is tied to the embedding), and
``total`` (model.parameters(), a tied weight once); the script checks embedding + layers * block + head
== total. ``active`` is what one token's forward uses: total less, in every MoE block of the module
tree, (experts - top_k) routed experts, with the number of experts taken from the block's experts
module and top_k from its router (``expert_params``: one routed expert; ``router_params``: the router's
parameters; ``router_buffers``: tensors the router keeps in its state_dict that are not parameters).
``tensors`` lists layer 0's named parameters as the modules hold them (transformers 5 fuses each
layer's routed experts into 3-D tensors); ``checkpoint_tensors`` lists layer 0's tensors in the
safetensors file that save_pretrained writes (the checkpoint layout, which may differ).

The config recorded is ``config.to_diff_dict()`` of the built model with "architectures" added, which
is what save_pretrained writes to config.json apart from "dtype"; the script rebuilds each model from
that dict and checks that it gets the same parameters. A case that does not build is listed under
"failures" with its error.

Usage (the python of the frameworks venv that scripts/frameworks-env.sh makes, build/frameworks):
python validation/measure_moe_params.py --out tests/documents/data/moe_params.json
(a few seconds on CPU).
"""
import argparse
import json
import logging
import platform
import tempfile
import warnings

BASE = {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2}

# Qwen2-MoE, Qwen3-MoE and OLMoE declare no head_dim (their attention reads it with a fallback of
# hidden_size // num_attention_heads = 16 here); Mixtral declares it.
CASES = [
    ("mixtral-default", "mixtral", {"head_dim": 16, "intermediate_size": 32, "num_local_experts": 4,
                                    "num_experts_per_tok": 2}),
    ("mixtral-tied", "mixtral", {"head_dim": 16, "intermediate_size": 32, "num_local_experts": 4,
                                 "num_experts_per_tok": 2, "tie_word_embeddings": True}),
    # qkv_bias left to the class (true): q/k/v biases, a shared expert with its sigmoid gate.
    ("qwen2-moe-shared", "qwen2_moe", {"intermediate_size": 96, "moe_intermediate_size": 32,
                                       "shared_expert_intermediate_size": 48, "num_experts": 8,
                                       "num_experts_per_tok": 2, "decoder_sparse_step": 1,
                                       "mlp_only_layers": []}),
    ("qwen2-moe-no-qkv-bias", "qwen2_moe", {"intermediate_size": 96, "moe_intermediate_size": 32,
                                            "shared_expert_intermediate_size": 48, "num_experts": 8,
                                            "num_experts_per_tok": 2, "decoder_sparse_step": 1,
                                            "mlp_only_layers": [], "qkv_bias": False}),
    ("qwen3-moe", "qwen3_moe", {"intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 8,
                                "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": []}),
    # head_dim unequal to hidden_size // num_attention_heads, as in the released Qwen3-MoE configs.
    ("qwen3-moe-head-dim", "qwen3_moe", {"intermediate_size": 96, "moe_intermediate_size": 32,
                                         "num_experts": 8, "num_experts_per_tok": 2,
                                         "decoder_sparse_step": 1, "mlp_only_layers": [], "head_dim": 32}),
    ("olmoe", "olmoe", {"intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2}),
    ("deepseek-v3", "deepseek_v3", {"num_key_value_heads": 4, "intermediate_size": 96,
                                    "moe_intermediate_size": 32, "n_routed_experts": 8,
                                    "num_experts_per_tok": 2, "n_shared_experts": 1,
                                    "first_k_dense_replace": 0, "q_lora_rank": 32, "kv_lora_rank": 16,
                                    "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
                                    "n_group": 1, "topk_group": 1}),
    ("deepseek-v3-no-q-lora", "deepseek_v3", {"num_key_value_heads": 4, "intermediate_size": 96,
                                              "moe_intermediate_size": 32, "n_routed_experts": 8,
                                              "num_experts_per_tok": 2, "n_shared_experts": 1,
                                              "first_k_dense_replace": 0, "q_lora_rank": None,
                                              "kv_lora_rank": 16, "qk_rope_head_dim": 8,
                                              "qk_nope_head_dim": 8, "v_head_dim": 16, "n_group": 1,
                                              "topk_group": 1}),
]


def build(model_type, keys):
    from transformers import AutoConfig, AutoModelForCausalLM
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **keys))


def shapes(named):
    return [[name, list(p.shape)] for name, p in named]


def units(model):
    layers = len(model.model.layers)
    counts = {"embedding": 0, "block": 0, "head": 0}
    for name, p in model.named_parameters():
        if name.startswith("model.embed_tokens."):
            counts["embedding"] += p.numel()
        elif name.startswith("model.layers.0."):
            counts["block"] += p.numel()
        elif name.startswith(("model.norm.", "lm_head.")):
            counts["head"] += p.numel()
        elif not name.startswith("model.layers."):
            raise RuntimeError(f"parameter {name} belongs to no unit")
    counts["total"] = sum(p.numel() for p in model.parameters())
    first = shapes(model.model.layers[0].named_parameters())
    for i, layer in enumerate(model.model.layers):
        assert shapes(layer.named_parameters()) == first, f"layer {i} differs from layer 0"
    assert counts["embedding"] + layers * counts["block"] + counts["head"] == counts["total"], counts
    return counts


def moe_blocks(layer):
    """The (experts, router) pairs of a decoder layer: modules with an `experts` and a `gate` child."""
    import torch
    return [(m.experts, m.gate) for m in layer.modules()
            if isinstance(getattr(m, "experts", None), torch.nn.Module)
            and isinstance(getattr(m, "gate", None), torch.nn.Module)]


def routed(model):
    """Active parameters of one token and the sizes of one routed expert and one router (layer 0)."""
    import torch
    inactive, expert_params, router_params, router_buffers = 0, None, None, None
    for i, layer in enumerate(model.model.layers):
        blocks = moe_blocks(layer)
        assert len(blocks) == 1, f"layer {i}: {len(blocks)} MoE blocks"
        experts, router = blocks[0]
        if isinstance(experts, torch.nn.ModuleList):
            n = len(experts)
        else:
            n = experts.num_experts
            for name, p in experts.named_parameters():
                assert p.shape[0] == n, f"layer {i}: experts.{name} {tuple(p.shape)} is not per expert"
        size = sum(p.numel() for p in experts.parameters())
        assert size % n == 0, (size, n)
        top_k = router.top_k
        inactive += (n - top_k) * (size // n)
        if i == 0:
            expert_params = size // n
            router_params = sum(p.numel() for p in router.parameters())
            params = dict(router.named_parameters())
            router_buffers = [[name, list(b.shape)] for name, b in router.state_dict().items()
                              if name not in params]
    return sum(p.numel() for p in model.parameters()) - inactive, expert_params, router_params, router_buffers


def checkpoint_tensors(model):
    """Layer 0's tensors as save_pretrained writes them to model.safetensors."""
    from safetensors import safe_open
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        with safe_open(f"{folder}/model.safetensors", "pt") as f:
            return sorted([name, list(f.get_slice(name).get_shape())] for name in f.keys()
                          if name.startswith("model.layers.0."))


def measure(name, model_type, changes):
    model = build(model_type, {**BASE, **changes})
    model.config.architectures = [type(model).__name__]
    config = model.config.to_diff_dict()
    assert config["model_type"] == model_type and config["architectures"] == [type(model).__name__]
    # The recorded dict rebuilds the same model (as a config.json would).
    again = build(model_type, {k: v for k, v in config.items()
                               if k not in ("architectures", "model_type", "transformers_version")})
    assert shapes(again.named_parameters()) == shapes(model.named_parameters()), name
    active, expert_params, router_params, router_buffers = routed(model)
    return {"id": name, "config": config, "params": units(model), "active": active,
            "expert_params": expert_params, "router_params": router_params,
            "router_buffers": router_buffers,
            "tensors": shapes(model.model.layers[0].named_parameters()),
            "checkpoint_tensors": checkpoint_tensors(model)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    cases, failures = [], []
    for name, model_type, changes in CASES:
        try:
            cases.append(measure(name, model_type, changes))
        except Exception as error:  # recorded, not skipped
            failures.append({"id": name, "error": f"{type(error).__name__}: {error}"})
    doc = {"schema_version": 1, "generated_by": "validation/measure_moe_params.py",
           "command": "python validation/measure_moe_params.py --out tests/documents/data/moe_params.json",
           "versions": {"python": platform.python_version(), "torch": torch.__version__,
                        "transformers": transformers.__version__},
           "cases": cases, "failures": failures}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
