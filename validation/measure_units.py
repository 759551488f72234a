#!/usr/bin/env python3
# Over 800 lines: one corpus, one command: the models, the hooks that measure and the writer stay
# in the one script that regenerates the corpus.
"""Measure, with the frameworks' own model code, the bytes autograd saves for backward per model unit.

What it measures
----------------
For each case (model x precision x attention x checkpointing x loss x shape) the script builds a tiny
model with random init (torch.manual_seed(0), float32 parameters, model.train()), feeds random token ids
[b, s] (labels = the input ids) and runs one forward plus loss inside
``torch.autograd.graph.saved_tensors_hooks(pack, unpack)``. Every tensor autograd saves for backward goes
through ``pack``; it is attributed to the unit active at that moment:

* ``embedding``: from the start of the forward until the first decoder layer starts (includes the
  rotary position-embedding computation in the model's forward);
* ``block i``: from decoder layer i's forward pre-hook until the next unit starts;
* ``head``: from the final norm's forward pre-hook to the end of the loss (final norm, lm_head, loss).

Bytes are counted per STORAGE once (the storage object, ``t.untyped_storage()._cdata``: the same as keying
on ``data_ptr()`` while storages stay allocated, and still right when FSDP2 frees an unsharded parameter
after a block's forward and allocates it again for the next use), ``nbytes`` read when the tensor is packed,
attributed to the first unit that saved it. The pack hook keeps a reference to every packed tensor so no
address or storage can be reused during the measurement. Each storage is classified:

* ``parameter``: a parameter's own storage (no new memory);
* ``buffer``: a module buffer's storage (e.g. torchtitan's RoPE cache; persistent model state);
* ``fsdp_unsharded_param``: the unsharded parameter FSDP2 all-gathers in its param_dtype (torchtitan recipe
  only); ``freed_before_backward`` says whether FSDP resharded (freed) it before backward;
* ``weight_copy``: a 16-bit tensor whose shape equals a parameter's shape or its transpose and whose
  autograd history leads (through casts and views only) to that parameter: autocast's cached cast of a
  weight. (Shape alone is not enough: a [b*s, h] activation can have a weight's shape.);
* ``activation``: everything else.

A storage that a later unit saves again (e.g. rotary cos/sin, saved by every block) is counted in the first
unit only; its entry there has ``saved_again_by_later_unit`` and the later units' entries have
``shared_with_earlier_unit``. Backward is run once after the measurement to check that the graph works.

Framework paths measured (cite these when reading the corpus)
-----------------------------------------------------------
* HF models: ``transformers.models.<arch>.modeling_<arch>.<Arch>ForCausalLM.forward`` with ``labels=``, so
  the loss is ``transformers.loss.loss_utils.ForCausalLMLoss`` (``logits.float()`` then
  ``fixed_cross_entropy`` -> ``torch.nn.functional.cross_entropy``): loss "upcast".
  Attention "flash" is ``attn_implementation="sdpa"``
  (``transformers.integrations.sdpa_attention.sdpa_attention_forward``, which passes ``is_causal=True``
  and no mask when the mask can be skipped); "eager" is each model's ``eager_attention_forward``.
  Checkpointing "full" is ``PreTrainedModel.activation_checkpointing_enable`` (the successor of the
  deprecated ``gradient_checkpointing_enable``) with ``{"use_reentrant": False}``; "every:2" is the same
  with ``every_n_layers=2`` (layers 0 and 2 checkpointed); "selective-op" wraps each decoder layer with
  torchtitan's own ``SelectiveAC`` (its ``_wrap_block``, as its trainer wraps its blocks).
  bf16-mixed: ``torch.autocast("cpu", dtype=torch.bfloat16)`` around forward and loss.
* torchtitan: ``torchtitan.models.llama3.Llama3Model`` built from ``Llama3Model.Config`` with layers from
  ``torchtitan.models.llama3._build_llama3_layers`` (fused wqkv, ``ComplexRoPE`` with
  ``max_seq_len = seq_len`` as ``Decoder.Config.update_from_config`` sets it from training.seq_len), inner
  attention ``torchtitan.models.common.attention.ScaledDotProductAttention`` (causal SDPA; torchtitan
  0.3.0's ``get_attention_config`` only offers flex/varlen for language models, which need torch.compile
  or CUDA). Parallelism as ``torchtitan.models.llama3.parallelize.parallelize_llama`` applies it on one
  rank: activation checkpointing (``torchtitan.distributed.activation_checkpoint.FullAC`` /
  ``SelectiveAC``) then ``torchtitan.distributed.fsdp.apply_fsdp_to_decoder`` (FSDP2 on a 1-rank gloo
  mesh), whose ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` is torchtitan's bf16-mixed
  (torchtitan 0.3.0 uses no autocast). Loss: ``torchtitan.components.loss.CrossEntropyLoss``
  (``cross_entropy_loss``: ``pred.flatten(0, 1).float()`` then cross_entropy with sum reduction),
  divided by the token count as the trainer does: loss "upcast".
* loss "fused": ``torch.compile`` (inductor, CPU) of the cross-entropy: for HF,
  ``torch.compile(transformers.loss.loss_utils.ForCausalLMLoss)`` applied to the logits of a forward
  without labels; for torchtitan, ``CrossEntropyLoss`` built with ``CompileConfig(enable=True,
  components=["loss"])`` (its ``_maybe_compile``). Dynamo is reset before each shape, so every shape is
  a first, static-shape compile as in a fixed-shape training run.
* loss "chunked:N": ``torchtitan.components.loss.ChunkedLossWrapper`` (model ``_skip_lm_head = True``;
  lm_head + loss per sequence chunk, each chunk's backward run inside the loss call). The chunk tensors
  are freed by that per-chunk backward, so the head's ``activation_bytes`` counts the tensors saved
  outside the chunks plus the largest chunk; ``head_chunk_activation_bytes`` lists every chunk.
  transformers 5.23 ships no chunked cross-entropy.

Config variants (CONFIGS, after the base models): multi-query attention (one key/value head), a
Mistral sliding window shorter than the longer sequences, a head wider than 256, GPT-NeoX's
hidden_dropout, and the MLP activations transformers offers for GPT-2's ``activation_function``
and GPT-NeoX's ``hidden_act``. The MQA, window and exact-GELU variants run the full grid; the
others (HF_SWEEP) run sdpa without checkpointing at both precisions, since what they change lies
inside the block and checkpointing keeps only the block's input. All of them come after the base
cases, which keep their order and bytes.

CPU measurement, GPU questions (read before deriving formulas)
------------------------------------------------------------
* Dropout: on CPU ``at::dropout`` takes its unfused path and saves the scaled noise tensor in the
  input's dtype; CUDA's ``native_dropout`` saves a bool mask (1 byte per element).
* SDPA with ``dropout_p > 0`` (GPT-2 with attn_pdrop 0.1) falls back on CPU to the math path
  (scores and softmax materialized); CUDA's flash/efficient kernels take dropout fused.
* torchtitan's per-op SAC save list names the CUDA flash op, not its CPU twin; the selective-op cases add
  ``aten._scaled_dot_product_flash_attention_for_cpu`` so the CPU run keeps what a GPU run keeps.
* Non-reentrant checkpointing keeps the checkpointed call's keyword arguments (HF: cos/sin position
  embeddings, masks) alive through the recompute closure, not as saved tensors: not counted here.

Run: ``python validation/measure_units.py --out tests/costmodel/data/oracle_units.json``
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import sys
import tempfile
import time
import warnings

import torch

SHAPES = [(32, 1), (64, 1), (64, 2), (128, 2)]  # (seq_len, micro_batch)
UNIT_EMBEDDING, UNIT_HEAD = "embedding", "head"
SIXTEEN_BIT = (torch.bfloat16, torch.float16)

# --------------------------------------------------------------------------------------------------
# Configs: HF config.json dicts the planner's parser accepts (documents/model.cpp).
# --------------------------------------------------------------------------------------------------

LLAMA_H128 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": 2,
    "intermediate_size": 352, "vocab_size": 1000, "num_hidden_layers": 3,
    "max_position_embeddings": 256, "hidden_act": "silu", "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "attention_bias": False, "attention_dropout": 0.0,
    "tie_word_embeddings": False,
}
CONFIGS = {
    "llama-h128": LLAMA_H128,
    "llama-h64": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
        "intermediate_size": 160, "vocab_size": 512, "num_hidden_layers": 3,
        "max_position_embeddings": 256, "hidden_act": "silu", "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0, "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": False,
    },
    "mistral-h128": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral",
        "hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": 2,
        "intermediate_size": 352, "vocab_size": 1000, "num_hidden_layers": 3,
        "max_position_embeddings": 256, "hidden_act": "silu", "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0, "sliding_window": 4096, "attention_dropout": 0.0,
        "tie_word_embeddings": False,
    },
    "qwen2-h128": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": 2,
        "intermediate_size": 352, "vocab_size": 1000, "num_hidden_layers": 3,
        "max_position_embeddings": 256, "hidden_act": "silu", "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "use_sliding_window": False, "attention_dropout": 0.0,
        "tie_word_embeddings": False,
    },
    "qwen2-h128-tied": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": 2,
        "intermediate_size": 352, "vocab_size": 1000, "num_hidden_layers": 3,
        "max_position_embeddings": 256, "hidden_act": "silu", "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "use_sliding_window": False, "attention_dropout": 0.0,
        "tie_word_embeddings": True,
    },
    "gpt2-h128": {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "n_embd": 128, "n_head": 8, "n_layer": 3, "n_positions": 256, "vocab_size": 1000,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05,
        "bos_token_id": 0, "eos_token_id": 0,
        "attn_pdrop": 0.1, "resid_pdrop": 0.1, "embd_pdrop": 0.1,
    },
    "gpt2-h128-nodrop": {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "n_embd": 128, "n_head": 8, "n_layer": 3, "n_positions": 256, "vocab_size": 1000,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05,
        "bos_token_id": 0, "eos_token_id": 0,
        "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
    },
    "gpt-neox-h128": {
        "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
        "hidden_size": 128, "num_attention_heads": 8, "intermediate_size": 512,
        "vocab_size": 1000, "num_hidden_layers": 3, "max_position_embeddings": 256,
        "hidden_act": "gelu", "layer_norm_eps": 1e-05, "rotary_pct": 0.25,
        "rotary_emb_base": 10000, "use_parallel_residual": True,
        "hidden_dropout": 0.0, "attention_dropout": 0.0, "tie_word_embeddings": False,
    },
    # torchtitan's Llama 3 with the shapes of llama-h128 (fused wqkv holds q, k and v: same count).
    "torchtitan-llama3-h128": dict(LLAMA_H128),
}


def variant(base, **changes):
    out = dict(CONFIGS[base])
    out.update(changes)
    return out


# Variants that change what the blocks save (each keyed to the config key or shape it stresses).
CONFIGS.update({
    # Multi-query attention (one key/value head): eager's repeat_kv can stay a stride-0 view.
    "llama-h128-mqa": variant("llama-h128", num_key_value_heads=1),
    # A sliding window shorter than the longer sequences (48 < 64, 128; not < 32): sdpa gets an
    # explicit mask and no GQA.
    "mistral-h128-window": variant("mistral-h128", sliding_window=48),
    "mistral-h128-mqa-window": variant("mistral-h128", sliding_window=48, num_key_value_heads=1),
    # GPT-2's activation_function and GPT-NeoX's hidden_act (transformers.activations.ACT2CLS).
    "gpt2-h128-gelu": variant("gpt2-h128-nodrop", activation_function="gelu"),
    "gpt2-h128-gelu_pytorch_tanh": variant("gpt2-h128-nodrop", activation_function="gelu_pytorch_tanh"),
    "gpt2-h128-gelu_fast": variant("gpt2-h128-nodrop", activation_function="gelu_fast"),
    "gpt2-h128-gelu_python": variant("gpt2-h128-nodrop", activation_function="gelu_python"),
    "gpt2-h128-gelu_python_tanh": variant("gpt2-h128-nodrop", activation_function="gelu_python_tanh"),
    "gpt2-h128-gelu_accurate": variant("gpt2-h128-nodrop", activation_function="gelu_accurate"),
    "gpt2-h128-gelu_10": variant("gpt2-h128-nodrop", activation_function="gelu_10"),
    "gpt2-h128-quick_gelu": variant("gpt2-h128-nodrop", activation_function="quick_gelu"),
    "gpt2-h128-relu": variant("gpt2-h128-nodrop", activation_function="relu"),
    "gpt2-h128-silu": variant("gpt2-h128-nodrop", activation_function="silu"),
    "gpt2-h128-swish": variant("gpt2-h128-nodrop", activation_function="swish"),
    "gpt2-h128-linear": variant("gpt2-h128-nodrop", activation_function="linear"),
    "gpt-neox-h128-gelu_new": variant("gpt-neox-h128", hidden_act="gelu_new"),
    "gpt-neox-h128-gelu_fast": variant("gpt-neox-h128", hidden_act="gelu_fast"),
    "gpt-neox-h128-relu": variant("gpt-neox-h128", hidden_act="relu"),
    # GPT-NeoX's hidden_dropout: the residual branches' dropout and the embeddings' (emb_dropout).
    "gpt-neox-h128-dropout": variant("gpt-neox-h128", hidden_dropout=0.1),
    # A head wider than 256: sdpa_attention_forward widens k and v itself (no enable_gqa).
    "llama-h128-hd320": variant("llama-h128", head_dim=320),
})
TORCHTITAN_ARGS = {
    "torchtitan-llama3-h128": {
        "model": "torchtitan.models.llama3.Llama3Model",
        "dim": 128, "n_layers": 3, "n_heads": 8, "n_kv_heads": 2, "hidden_dim": 352,
        "vocab_size": 1000, "enable_weight_tying": False, "fuse_qkv": True,
        "rope": "ComplexRoPE(dim=16, theta=500000, scaling='llama', max_seq_len=seq_len)",
        "inner_attention": "torchtitan.models.common.attention.ScaledDotProductAttention",
    }
}

# What the brief asked for that these framework versions do not offer (written to the output).
NOT_MEASURED = [
    {"what": "torchtitan checkpointing every:2 (layer-selective AC)",
     "why": "torchtitan 0.3.0's torchtitan.distributed.activation_checkpoint offers FullAC, SelectiveAC "
            "(per-op only) and MemoryBudgetAC (compiled models); the layer-selective mode is gone. "
            "The HF recipe's every:2 (activation_checkpointing_enable(every_n_layers=2)) is measured."},
    {"what": "torchtitan eager attention",
     "why": "torchtitan has no eager (materialized-scores) attention; its LM backends are flex and varlen."},
    {"what": "loss chunked:N for HF",
     "why": "transformers 5.23 ships no chunked cross-entropy (transformers.loss.loss_utils has "
            "ForCausalLMLoss only); torchtitan's ChunkedLossWrapper is measured."},
]

HF_MODELS = [  # (config name, HF class)
    ("llama-h128", "LlamaForCausalLM"),
    ("llama-h64", "LlamaForCausalLM"),
    ("mistral-h128", "MistralForCausalLM"),
    ("qwen2-h128", "Qwen2ForCausalLM"),
    ("qwen2-h128-tied", "Qwen2ForCausalLM"),
    ("gpt2-h128", "GPT2LMHeadModel"),
    ("gpt2-h128-nodrop", "GPT2LMHeadModel"),
    ("gpt-neox-h128", "GPTNeoXForCausalLM"),
]
# Variants on the same full grid, run after every case above (so the earlier cases keep their
# order in the output).
HF_VARIANTS = [
    ("llama-h128-mqa", "LlamaForCausalLM"),
    ("mistral-h128-window", "MistralForCausalLM"),
    ("gpt2-h128-gelu", "GPT2LMHeadModel"),
]
# Variants whose difference lies in one module (the MLP's activation; the mask of sdpa): measured
# without checkpointing (which keeps only the block's input, whatever the module saves), with
# sdpa, at both precisions and every shape.
HF_SWEEP = [
    ("mistral-h128-mqa-window", "MistralForCausalLM"),
    ("gpt2-h128-gelu_pytorch_tanh", "GPT2LMHeadModel"),
    ("gpt2-h128-gelu_fast", "GPT2LMHeadModel"),
    ("gpt2-h128-gelu_python", "GPT2LMHeadModel"),
    ("gpt2-h128-gelu_python_tanh", "GPT2LMHeadModel"),
    ("gpt2-h128-gelu_accurate", "GPT2LMHeadModel"),
    ("gpt2-h128-gelu_10", "GPT2LMHeadModel"),
    ("gpt2-h128-quick_gelu", "GPT2LMHeadModel"),
    ("gpt2-h128-relu", "GPT2LMHeadModel"),
    ("gpt2-h128-silu", "GPT2LMHeadModel"),
    ("gpt2-h128-swish", "GPT2LMHeadModel"),
    ("gpt2-h128-linear", "GPT2LMHeadModel"),
    ("gpt-neox-h128-gelu_new", "GPTNeoXForCausalLM"),
    ("gpt-neox-h128-gelu_fast", "GPTNeoXForCausalLM"),
    ("gpt-neox-h128-relu", "GPTNeoXForCausalLM"),
    ("gpt-neox-h128-dropout", "GPTNeoXForCausalLM"),
    ("llama-h128-hd320", "LlamaForCausalLM"),
]


def case_plan():
    """The fixed, ordered list of case groups; each group runs at every shape in SHAPES."""
    groups = []

    def full_grid(models):
        for config, cls in models:
            for precision in ("fp32", "bf16-mixed"):
                for attention in ("flash", "eager"):
                    for ckpt in ("none", "full"):
                        groups.append(dict(recipe="hf", config=config, model_class=cls,
                                           precision=precision, attention=attention,
                                           checkpointing=ckpt, loss="upcast"))
    full_grid(HF_MODELS)
    groups.append(dict(recipe="hf", config="llama-h128", model_class="LlamaForCausalLM",
                       precision="bf16-mixed", attention="flash", checkpointing="every:2",
                       loss="upcast"))
    for precision in ("fp32", "bf16-mixed"):
        for ckpt in ("none", "full", "selective-op"):
            groups.append(dict(recipe="torchtitan", config="torchtitan-llama3-h128",
                               model_class="torchtitan.models.llama3.Llama3Model",
                               precision=precision, attention="flash", checkpointing=ckpt,
                               loss="upcast"))
    groups.append(dict(recipe="hf", config="llama-h128", model_class="LlamaForCausalLM",
                       precision="bf16-mixed", attention="flash", checkpointing="none",
                       loss="fused"))
    for loss in ("fused", "chunked:4"):
        groups.append(dict(recipe="torchtitan", config="torchtitan-llama3-h128",
                           model_class="torchtitan.models.llama3.Llama3Model",
                           precision="bf16-mixed", attention="flash", checkpointing="none",
                           loss=loss))
    full_grid(HF_VARIANTS)
    for config, cls in HF_SWEEP:
        for precision in ("fp32", "bf16-mixed"):
            groups.append(dict(recipe="hf", config=config, model_class=cls, precision=precision,
                               attention="flash", checkpointing="none", loss="upcast"))
    # torchtitan's SelectiveAC around transformers' Llama-family layers: its mm count over their
    # own linears (q, k, v apart; Qwen2's biased q, k, v run addmm), sdpa and eager attention.
    for config, cls, attentions in (("llama-h128", "LlamaForCausalLM", ("flash", "eager")),
                                    ("qwen2-h128", "Qwen2ForCausalLM", ("flash",))):
        for precision in ("fp32", "bf16-mixed"):
            for attention in attentions:
                groups.append(dict(recipe="hf", config=config, model_class=cls,
                                   precision=precision, attention=attention,
                                   checkpointing="selective-op", loss="upcast"))
    return groups


# --------------------------------------------------------------------------------------------------
# Recording saved tensors per unit.
# --------------------------------------------------------------------------------------------------

class SavedTensorRecorder:
    """saved_tensors_hooks pack/unpack pair that records every saved tensor with the current unit."""

    def __init__(self):
        self.unit = UNIT_EMBEDDING
        self.events = []  # (unit, tensor, storage key, storage nbytes at pack time)
        self.keep = []    # references to every packed tensor: no storage is freed while we count

    def set_unit(self, name):
        self.unit = name

    def pack(self, t):
        self.keep.append(t)
        try:
            storage = t.untyped_storage()
            key, nbytes = storage._cdata, storage.nbytes()
        except (RuntimeError, NotImplementedError):  # no plain storage: count the tensor itself
            key, nbytes = ("tensor", id(t)), t.numel() * t.element_size()
        self.events.append((self.unit, t, key, nbytes))
        return t

    @staticmethod
    def unpack(t):
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def install_unit_markers(recorder, layers, final_norm, chunked_lm_head=None):
    """Forward pre-hooks: decoder layer i starts "block i", the final norm starts "head"."""
    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(
            lambda *_, name=f"block {i}": recorder.set_unit(name)))
    handles.append(final_norm.register_forward_pre_hook(lambda *_: recorder.set_unit(UNIT_HEAD)))
    if chunked_lm_head is not None:
        counter = {"n": 0}

        def chunk_start(*_):
            recorder.set_unit(f"{UNIT_HEAD}/chunk {counter['n']}")
            counter["n"] += 1
        handles.append(chunked_lm_head.register_forward_pre_hook(chunk_start))
    return handles


# --------------------------------------------------------------------------------------------------
# Classification of storages.
# --------------------------------------------------------------------------------------------------

PASS_THROUGH = {"ToCopyBackward0", "TBackward0", "TransposeBackward0", "PermuteBackward0",
                "ViewBackward0", "UnsafeViewBackward0", "ExpandBackward0", "AliasBackward0"}


def parameter_origin(t):
    """The leaf a tensor derives from through casts and views only (autocast's weight cast), or None."""
    fn = t.grad_fn
    for _ in range(6):
        if fn is None:
            return None
        if fn.name() == "torch::autograd::AccumulateGrad":
            return fn.variable
        if fn.name() not in PASS_THROUGH:
            return None
        nxt = [f for f, _ in fn.next_functions if f is not None]
        if len(nxt) != 1:
            return None
        fn = nxt[0]
    return None


class StorageClassifier:
    """Knows the model's parameter, buffer and FSDP2 unsharded-parameter storages."""

    def __init__(self, model):
        self.param_storages = set()
        self.param_shapes = set()
        for p in model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            self.param_storages.add(local.untyped_storage()._cdata)
            self.param_shapes.add(tuple(p.shape))
            if p.dim() == 2:
                self.param_shapes.add(tuple(p.shape)[::-1])
        self.buffer_storages = {b.untyped_storage()._cdata for b in model.buffers()}
        self.fsdp_storages = set()

    def note_fsdp_unsharded(self, model):
        """After the forward: the storages of FSDP2's unsharded parameters (they exist by then)."""
        try:
            from torch.distributed.fsdp import FSDPModule
        except ImportError:
            return
        for mod in model.modules():
            if not isinstance(mod, FSDPModule):
                continue
            group = mod._get_fsdp_state()._fsdp_param_group
            for fp in (group.fsdp_params if group is not None else []):
                if hasattr(fp, "_unsharded_param"):
                    self.fsdp_storages.add(fp._unsharded_param.untyped_storage()._cdata)

    def kind(self, t, key):
        if key in self.param_storages:
            return "parameter"
        if key in self.fsdp_storages:
            return "fsdp_unsharded_param"
        if key in self.buffer_storages:
            return "buffer"
        if t.dtype in SIXTEEN_BIT and tuple(t.shape) in self.param_shapes:
            origin = parameter_origin(t)
            if origin is not None and (tuple(origin.shape) == tuple(t.shape)
                                       or tuple(origin.shape)[::-1] == tuple(t.shape)):
                return "weight_copy"
        return "activation"


# --------------------------------------------------------------------------------------------------
# Summaries.
# --------------------------------------------------------------------------------------------------

KIND_FIELD = {"activation": "activation_bytes", "weight_copy": "weight_copy_bytes",
              "parameter": "parameter_bytes", "buffer": "buffer_bytes",
              "fsdp_unsharded_param": "fsdp_unsharded_param_bytes"}
FUSED_KERNELS = {
    "ScaledDotProductFlashAttentionForCpuBackward0": "sdpa:_scaled_dot_product_flash_attention_for_cpu",
    "ScaledDotProductFlashAttentionBackward0": "sdpa:_scaled_dot_product_flash_attention",
    "ScaledDotProductEfficientAttentionBackward0": "sdpa:_scaled_dot_product_efficient_attention",
    "ScaledDotProductCudnnAttentionBackward0": "sdpa:_scaled_dot_product_cudnn_attention",
}


def unit_order(n_layers):
    return [UNIT_EMBEDDING] + [f"block {i}" for i in range(n_layers)] + [UNIT_HEAD]


def summarise_units(recorder, classifier, n_layers, with_tensors):
    """Per-unit byte totals (each storage once, in the first unit that saved it) and tensor lists."""
    first_unit = {}      # storage key -> first unit (chunk sub-units included)
    entries = {}         # (unit, key) -> entry
    order = []
    for unit, t, key, nbytes in recorder.events:
        if (unit, key) in entries:
            entries[(unit, key)]["saves"] += 1
            continue
        shared = key in first_unit and first_unit[key] != unit
        first_unit.setdefault(key, unit)
        entry = {
            "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
            "bytes": int(nbytes), "grad_fn": t.grad_fn.name() if t.grad_fn is not None else None,
            "kind": classifier.kind(t, key), "shared_with_earlier_unit": shared,
            "saved_again_by_later_unit": False, "saves": 1,
        }
        try:
            entry["freed_before_backward"] = (t.untyped_storage().nbytes() == 0 and nbytes > 0)
        except (RuntimeError, NotImplementedError):
            entry["freed_before_backward"] = False
        if shared:
            for (u, k), e in entries.items():
                if k == key and u == first_unit[key]:
                    e["saved_again_by_later_unit"] = True
        entries[(unit, key)] = entry
        order.append((unit, key))

    def totals(keys):
        out = {field: 0 for field in KIND_FIELD.values()}
        for k in keys:
            e = entries[k]
            if not e["shared_with_earlier_unit"]:
                out[KIND_FIELD[e["kind"]]] += e["bytes"]
        return out

    units = {}
    for name in unit_order(n_layers):
        keys = [k for k in order if k[0] == name]
        chunk_names = sorted({k[0] for k in order if k[0].startswith(name + "/chunk ")},
                             key=lambda n: int(n.split()[-1])) if name == UNIT_HEAD else []
        summary = totals(keys)
        if chunk_names:
            per_chunk = [totals([k for k in order if k[0] == c]) for c in chunk_names]
            summary["head_chunk_activation_bytes"] = [c["activation_bytes"] for c in per_chunk]
            for field in KIND_FIELD.values():  # chunk graphs die one by one: the largest chunk counts
                summary[field] += max(c[field] for c in per_chunk)
        if with_tensors:
            tensors = []
            for k in keys + [k for c in chunk_names for k in order if k[0] == c]:
                e = dict(entries[k])
                if k[0] != name:
                    e["chunk"] = int(k[0].split()[-1])
                tensors.append(e)
            summary["tensors"] = tensors
        units[name] = summary
    unknown = {k[0] for k in order} - set(units) - {
        u for u in (k[0] for k in order) if u.startswith(UNIT_HEAD + "/chunk ")}
    if unknown:
        raise RuntimeError(f"saved tensors in units outside the plan: {sorted(unknown)}")
    return units


def attention_kernel(recorder, attention):
    """Which attention kernel ran, from the grad_fn names of the tensors the blocks saved."""
    names = {t.grad_fn.name() for unit, t, _, _ in recorder.events
             if unit.startswith("block") and t.grad_fn is not None}
    fused = sorted(FUSED_KERNELS[n] for n in names if n in FUSED_KERNELS)
    if fused:
        return ", ".join(fused)
    if any("Softmax" in n for n in names):
        return ("sdpa:math (scores materialized: softmax saved)" if attention == "flash"
                else "eager: matmul + softmax (scores materialized)")
    return None  # not visible (everything inside the checkpointed region is recomputed)


# --------------------------------------------------------------------------------------------------
# HF models.
# --------------------------------------------------------------------------------------------------

def hf_config(config_dict, attention):
    import transformers
    kwargs = {k: v for k, v in config_dict.items() if k not in ("architectures", "model_type")}
    cfg = transformers.AutoConfig.for_model(config_dict["model_type"], **kwargs)
    cfg.architectures = list(config_dict["architectures"])
    cfg._attn_implementation = {"flash": "sdpa", "eager": "eager"}[attention]
    cfg.use_cache = False
    return cfg


def build_hf_model(group):
    """transformers <Arch>ForCausalLM with random init, fp32, train mode, optional checkpointing."""
    import transformers
    cfg = hf_config(CONFIGS[group["config"]], group["attention"])
    torch.manual_seed(0)
    model = getattr(transformers, group["model_class"])._from_config(
        cfg, attn_implementation=cfg._attn_implementation, dtype=torch.float32)
    model.train()
    ckpt = group["checkpointing"]
    if ckpt == "selective-op":
        # torchtitan's own SelectiveAC policy around each of transformers' decoder layers, as its
        # trainer wraps its own blocks (apply_torchtitan_ac): the policy counts the aten ops the
        # layer dispatches, whichever model code runs them.
        sac = selective_ac()
        for i, layer in enumerate(model.model.layers):
            wrapped = sac._wrap_block(layer, base_fqn=f"model.layers.{i}")
            wrapped.checkpoint_fn = functools.partial(wrapped.checkpoint_fn,
                                                      respect_saved_tensors_hooks=True)
            model.model.layers[i] = wrapped
    elif ckpt != "none":
        every = 1 if ckpt == "full" else int(ckpt.split(":")[1])
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}, every_n_layers=every)
    return model


def hf_parts(model):
    """Decoder layers and final norm of an HF causal LM."""
    base = model.base_model
    layers = getattr(base, "layers", None) or getattr(base, "h")
    norm = next(getattr(base, n) for n in ("norm", "ln_f", "final_layer_norm") if hasattr(base, n))
    return list(layers), norm


def run_hf(model, group, seq_len, batch, recorder):
    """One forward + the model's loss (or a compiled ForCausalLMLoss) under the hooks."""
    torch.manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq_len))
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if group["precision"] == "bf16-mixed"
                else contextlib.nullcontext())
    recorder.set_unit(UNIT_EMBEDDING)
    with recorder.hooks(), autocast:
        if group["loss"] == "upcast":
            out = model(input_ids=ids, labels=ids)
            loss = out.loss
        elif group["loss"] == "fused":
            out = model(input_ids=ids)
            loss = compiled_hf_loss()(out.logits, ids, vocab_size=model.config.vocab_size)
        else:
            raise ValueError(group["loss"])
    return loss, out.logits


@functools.lru_cache(maxsize=None)
def compiled_hf_loss():
    from transformers.loss.loss_utils import ForCausalLMLoss
    return torch.compile(ForCausalLMLoss)


# --------------------------------------------------------------------------------------------------
# torchtitan.
# --------------------------------------------------------------------------------------------------

_DIST_READY = False


def init_single_rank_gloo():
    """A 1-rank gloo process group: FSDP2 needs one even when nothing is sharded."""
    global _DIST_READY
    import torch.distributed as dist
    if not _DIST_READY:
        dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(prefix="pg-"),
                                rank=0, world_size=1)
        _DIST_READY = True
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))


def selective_ac():
    """torchtitan's SelectiveAC with its default save list. On CUDA the flash SDPA op
    (aten._scaled_dot_product_flash_attention) is in the list; its CPU twin is not, so it is added
    to measure what a GPU run keeps."""
    from torchtitan.distributed.activation_checkpoint import SelectiveAC
    sac = SelectiveAC.Config().build()
    default_ops = sac.get_save_ops()
    sac.get_save_ops = lambda: default_ops | {
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}
    return sac


def apply_torchtitan_ac(model, ckpt):
    """torchtitan's activation checkpointing policy on a Llama3Model's blocks: none, FullAC, or
    SelectiveAC (its per-op save list), as its trainer applies it."""
    from torchtitan.distributed.activation_checkpoint import FullAC
    if ckpt == "full":
        FullAC.Config().build().apply(model)
    elif ckpt == "selective-op":
        selective_ac().apply(model)
    elif ckpt != "none":
        raise ValueError(ckpt)
    if ckpt == "selective-op":
        # SAC caches the ops it saves outside autograd's SavedVariables; torch>=2.15 routes them
        # through the surrounding saved_tensors_hooks when checkpoint() is told to (no other change).
        for block in model.layers.values():
            block.checkpoint_fn = functools.partial(block.checkpoint_fn,
                                                    respect_saved_tensors_hooks=True)


def torchtitan_model_config(name, seq_len):
    """torchtitan 0.3.0's Llama3Model.Config for TORCHTITAN_ARGS[name], causal SDPA attention."""
    import torchtitan.models.llama3 as llama3
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention

    a = TORCHTITAN_ARGS[name]
    dim, n_heads = a["dim"], a["n_heads"]
    layers = llama3._build_llama3_layers(
        n_layers=a["n_layers"], dim=dim, n_heads=n_heads, n_kv_heads=a["n_kv_heads"],
        hidden_dim=a["hidden_dim"], fuse_qkv=a["fuse_qkv"], attn_backend="flex",
        rope=ComplexRoPE.Config(dim=dim // n_heads, max_seq_len=seq_len, theta=500000,
                                scaling="llama"))
    for layer in layers:  # causal SDPA instead of flex (flex needs torch.compile; see the docstring)
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    V = a["vocab_size"]
    return llama3.Llama3Model.Config(
        dim=dim, vocab_size=V, enable_weight_tying=a["enable_weight_tying"],
        tok_embeddings=Embedding.Config(num_embeddings=V, embedding_dim=dim,
                                        param_init=llama3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=V,
                              param_init=llama3._output_linear_init(dim)),
        layers=layers)


def build_torchtitan_model(group, seq_len):
    """Llama3Model as torchtitan builds it, then AC and FSDP2 in parallelize_llama's order."""
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    config = torchtitan_model_config(group["config"], seq_len)
    torch.manual_seed(0)
    model = config.build()
    model.init_states(buffer_device=torch.device("cpu"))
    model.train()

    apply_torchtitan_ac(model, group["checkpointing"])

    mesh = init_single_rank_gloo()
    param_dtype = torch.bfloat16 if group["precision"] == "bf16-mixed" else torch.float32
    apply_fsdp_to_decoder(model, mesh, param_dtype=param_dtype, reduce_dtype=torch.float32,
                          pp_enabled=False)
    return model


def build_torchtitan_loss(group, model, recorder):
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.config import CompileConfig
    loss = group["loss"]
    if loss == "upcast":
        return CrossEntropyLoss.Config().build()
    if loss == "fused":
        return CrossEntropyLoss.Config().build(
            compile_config=CompileConfig(enable=True, components=["loss"]))
    if loss.startswith("chunked:"):
        fn = ChunkedLossWrapper.Config(num_chunks=int(loss.split(":")[1])).build()
        fn.set_lm_head(model.lm_head)
        model._skip_lm_head = True
        backprop = fn._gradient_backprop

        def mark_head(*args, **kwargs):  # the bridge to the decoder's backward is a head tensor
            recorder.set_unit(UNIT_HEAD)
            return backprop(*args, **kwargs)
        fn._gradient_backprop = mark_head
        return fn
    raise ValueError(loss)


def run_torchtitan(model, loss_fn, group, seq_len, batch, recorder):
    """The trainer's forward_backward_step body: pred = model(inputs); loss_fn(pred, labels, tokens)."""
    torch.manual_seed(1)
    ids = torch.randint(0, TORCHTITAN_ARGS[group["config"]]["vocab_size"], (batch, seq_len))
    recorder.set_unit(UNIT_EMBEDDING)
    with recorder.hooks():
        pred = model(ids)
        loss, _ = loss_fn(pred, ids, torch.tensor(batch * seq_len))
    logits = None if group["loss"].startswith("chunked") else pred
    return loss, logits, pred


# --------------------------------------------------------------------------------------------------
# Cases.
# --------------------------------------------------------------------------------------------------

def case_id(group, seq_len, batch):
    config = group["config"]
    if group["recipe"] == "hf":  # LlamaForCausalLM-h128, GPT2LMHeadModel-h128-nodrop, ...
        name = group["model_class"] + config[config.index("-h"):]
    else:
        name = config
    return "/".join([group["recipe"], name, group["precision"], group["attention"], group["loss"],
                     group["checkpointing"], f"s{seq_len}-b{batch}"])


def measure_case(group, seq_len, batch, model, with_tensors):
    """Run one case; returns the case record (raises if forward, loss or backward fail)."""
    recorder = SavedTensorRecorder()
    if group["recipe"] == "hf":
        layers, norm = hf_parts(model)
        handles = install_unit_markers(recorder, layers, norm)
        classifier = StorageClassifier(model)
        loss, logits = run_hf(model, group, seq_len, batch, recorder)
        output = logits
    else:
        loss_fn = build_torchtitan_loss(group, model, recorder)
        layers = list(model.layers.values())
        chunk_head = model.lm_head if group["loss"].startswith("chunked") else None
        handles = install_unit_markers(recorder, layers, model.norm, chunk_head)
        classifier = StorageClassifier(model)
        loss, logits, output = run_torchtitan(model, loss_fn, group, seq_len, batch, recorder)
    classifier.note_fsdp_unsharded(model)
    units = summarise_units(recorder, classifier, len(layers), with_tensors)
    kernel = attention_kernel(recorder, group["attention"])
    for h in handles:
        h.remove()
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    if not any(g is not None for g in grads):
        raise RuntimeError("backward produced no gradient")
    model.zero_grad(set_to_none=True)
    record = dict(group)
    record.update({
        "id": case_id(group, seq_len, batch), "seq_len": seq_len, "micro_batch": batch,
        "attention_kernel": kernel, "units": units,
        "logits_alive_bytes": int(logits.untyped_storage().nbytes()) if logits is not None else 0,
        "model_output_bytes": int(output.untyped_storage().nbytes()),
        "mixed_precision_mechanism": ("none" if group["precision"] == "fp32" else
                                      "autocast" if group["recipe"] == "hf" else
                                      "fsdp2-mixed-precision-policy"),
        "backward_ok": True,
    })
    return record


def run_group(group, with_tensors_first=True):
    """All shapes of one case group; an HF model is built once per group, torchtitan's per shape."""
    records = []
    model = build_hf_model(group) if group["recipe"] == "hf" else None
    for i, (seq_len, batch) in enumerate(SHAPES):
        if group["loss"] == "fused":
            # A training run compiles its fixed shape once. Without a reset, the later shapes reuse a
            # graph recompiled with symbolic sizes, whose partition saves other tensors (e.g. an fp32
            # [b*s, V] logits copy instead of the bf16 logits).
            torch._dynamo.reset()
        if group["recipe"] == "torchtitan":
            model = build_torchtitan_model(group, seq_len)
        records.append(measure_case(group, seq_len, batch, model, with_tensors_first and i == 0))
    return records


def fill_missing_kernels(cases):
    """Checkpointed blocks save no attention tensor: take the kernel of the same model run without."""
    seen = {}
    for c in cases:
        if c["attention_kernel"] is not None:
            seen.setdefault((c["recipe"], c["config"], c["precision"], c["attention"],
                             c["seq_len"], c["micro_batch"]), c["attention_kernel"])
    for c in cases:
        if c["attention_kernel"] is None:
            k = seen.get((c["recipe"], c["config"], c["precision"], c["attention"],
                          c["seq_len"], c["micro_batch"]))
            c["attention_kernel"] = (k + " (as run without checkpointing)") if k else "not visible"


def versions():
    import transformers
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__}
    try:
        import torchtitan  # noqa: F401
        from importlib.metadata import version
        out["torchtitan"] = version("torchtitan")
    except Exception as e:  # pragma: no cover - reported in the output
        out["torchtitan"] = f"unavailable: {e}"
    return out


def repo_relative(path):
    """Paths as given relative to the repository root (no machine-specific prefix in the output)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = os.path.abspath(path)
    return os.path.relpath(p, root) if p.startswith(root + os.sep) else os.path.basename(p)


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
    have_titan = True
    try:
        import torchtitan  # noqa: F401
    except Exception as e:
        have_titan = False
        print(f"torchtitan unavailable, its cases are skipped: {e}", file=sys.stderr)

    cases, dropped = [], []
    for group in case_plan():
        if group["recipe"] == "torchtitan" and not have_titan:
            continue
        if args.only and not any(t in case_id(group, 0, 0) for t in args.only.split(",")):
            continue
        t0 = time.time()
        try:
            records = run_group(group)
        except Exception as e:
            dropped.append({"group": group, "error": f"{type(e).__name__}: {e}"})
            print(f"DROPPED {group}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        cases.extend(records)
        print(f"{records[0]['id'].rsplit('/', 1)[0]}: {len(records)} shapes, "
              f"{time.time() - t0:.1f} s, kernel {records[0]['attention_kernel']}", file=sys.stderr)
    fill_missing_kernels(cases)

    configs = {name: dict(cfg) for name, cfg in CONFIGS.items()}
    out = {
        "schema_version": 1,
        "generated_by": "validation/measure_units.py",
        "command": "python validation/measure_units.py --out " + repo_relative(args.out)
                   + (f" --only {args.only}" if args.only else ""),
        "versions": versions(),
        "configs": configs,
        "torchtitan_args": TORCHTITAN_ARGS,
        "shapes": [{"seq_len": s, "micro_batch": b} for s, b in SHAPES],
        "cases": cases,
        "dropped": dropped,
        "not_measured": NOT_MEASURED,
    }
    write_corpus_json(args.out, out, f"{len(cases)} cases, {len(dropped)} groups dropped", start)


def write_corpus_json(path, out, summary, start):
    """Writes a corpus document (sorted keys, one space of indent) and says on stderr what it holds,
    how long the run took and how large the file is."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{summary}, {time.time() - start:.0f} s, {os.path.getsize(path)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
