#!/usr/bin/env python3
# Over 800 lines: one corpus, one command: the pipe layers, the engine buffers it names, the
# reference and the writer stay in the one script that regenerates the corpus.
"""Measure the per-stage memory of DeepSpeed's own pipeline engine (PipelineModule, PipelineEngine).

What it measures
    ``deepspeed.pipe.PipelineModule`` run by DeepSpeed's ``PipelineEngine``
    (``engine.train_batch(data_iter)``), world size 2, ``num_stages=2`` (no data parallelism), on
    ``transformers.LlamaForCausalLM`` in the llama-h256 config of validation/measure_steps.py
    (hidden 256, intermediate 704, 4 blocks, 8 heads, 2 kv heads, vocabulary 4096, float32
    initialisation with seed 0, sdpa attention, dropout 0, untied embeddings). The model is written
    as a list of pipe layers, as users port HF models to DeepSpeed pipelines, each holding the HF
    model's own modules:

    - ``EmbeddingPipe``: ``embed_tokens`` (token ids -> hidden states);
    - ``LlamaDecoderLayerPipe`` x 4: one ``LlamaDecoderLayer`` each, called through its own forward
      as ``LlamaModel.forward`` calls it (``attention_mask=None``: sdpa's causal kernel,
      ``position_ids``, ``position_embeddings``). A pipe layer passes only the hidden states to
      the next, so each block's pipe layer computes the rotary (cos, sin) itself, at the start of
      its forward, with the HF model's one ``LlamaRotaryEmbedding`` (its inv_freq buffers shared
      by the blocks of a stage): ``position_ids = arange(seq)`` and two tensors [1, seq, head_dim
      = 32] in the hidden states' dtype per block and micro-batch (fp32: 2 x 128 x 32 x 4 = 32 KiB
      at seq 128). The attention keeps them for its backward (the rotary products save cos and
      sin), so without checkpointing a stage holds one (cos, sin) per block and in-flight
      micro-batch, where LlamaModel (and validation/measure_pipeline.py's stages) computes them
      once per forward and shares them among the blocks; with checkpointing they are made again
      in the recomputation. DeepSpeed casts parameters only, not buffers
      (``DeepSpeedEngine._configure_distributed_model``: "preserve fp32 buffers (e.g. rotary
      inv_freq)"), so under bf16 inv_freq stays fp32 and cos/sin are cast to bf16 by HF's rotary
      forward;
    - ``LlamaHeadPipe``: the final ``norm`` and ``lm_head`` (logits).

    ``loss_fn`` is torchtitan's cross-entropy of validation/measure_pipeline.py,
    ``cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))``: the logits upcast to
    float32, the labels the input ids themselves, not shifted (transformers' ForCausalLMLoss
    shifts them; this corpus, like oracle_pipeline.json, does not). Each micro-batch of the data
    iterator is ``(ids, ids)``.

    ``partition_method="parameters"`` (DeepSpeed's default) splits the 6 pipe layers 3 + 3: stage 0
    the embedding and blocks 0-1 (2,458,624 parameters), stage 1 blocks 2-3, the final norm and the
    head (2,458,880); "uniform" gives the same split. Each stage's record lists its layers.

    The optimizer is the client's ``torch.optim.AdamW(lr=1e-3, foreach=True)`` over the stage's
    parameters, passed to ``deepspeed.initialize(model=module, optimizer=..., config=...)``, with
    ``zero_allow_untested_optimizer: true``. DeepSpeed wraps it according to precision and ZeRO
    stage (``DeepSpeedEngine._do_optimizer_sanity_check``): fp32 at stage 0 uses the AdamW as is;
    "bf16-mixed" (``"bf16": {"enabled": true}``: parameters cast to bfloat16, no autocast, the
    gradient accumulation dtype left at its default, the model's bf16) at stage 0 gets
    ``BF16_Optimizer`` (bf16 params + fp32 master + a bf16 gradient-accumulation buffer;
    DeepSpeed warns "BF16 gradient accumulation is not safe numerically"); ZeRO stage 1 gets
    ``DeepSpeedZeroOptimizer`` (stage_1_and_2.py) in both precisions. ZeRO stages 2 and 3 are
    refused by the engine (pipe/engine.py, ``PipelineEngine.__init__``: "ZeRO-2 and ZeRO-3 are
    incompatible with pipeline parallelism"); the harness probes stage 2 and records the refusal.

    The grid: ZeRO stage 0/1 x precision fp32/bf16-mixed x checkpointing none/full x micro-batches
    m (``gradient_accumulation_steps``) 2/4 x sequence 128/256, micro-batch 1
    (``train_micro_batch_size_per_gpu``). "full" is ``PipelineModule(activation_checkpoint_interval
    =1, checkpointable_layers=["LlamaDecoderLayerPipe"])`` with DeepSpeed's own checkpoint function
    at its defaults (``deepspeed.checkpointing.checkpoint``: the reentrant ``CheckpointFunction``,
    no partitioned, contiguous or CPU activations; the config's ``pipeline.use_reentrant``
    default, true): every block is its own checkpointed segment, the embedding and the head are
    not. It keeps, per block and in-flight micro-batch, the block's input (the tensor passed to
    ``CheckpointFunction.forward``, held in ``ctx.deepspeed_saved_tensors``), and recomputes the
    block in its backward. DeepSpeed's default checkpointable layers (``checkpointable_layers=
    None``: every layer with parameters, the embedding included) cannot train here:
    ``PipelineModule._is_checkpointable`` (pipe/module.py) keeps the embedding out only for
    classes named GPTModelPipe/GPT2ModelPipe, the reentrant function then gets the token ids
    (no gradient) as its only input, its output needs no gradient, and stage 0's
    ``outputs.backward(gradient=...)`` (pipe/engine.py, ``_exec_backward_pass``) fails; the
    harness probes it and records the error.

How it measures
    On each rank, ``MemTracker`` with the ``_PeakProbe`` of validation/measure_steps.py over the
    second ``train_batch`` (one warm-up ``train_batch`` first, each with a fresh iterator over the
    same m micro-batches): storage bytes per category, the categories at the peak, each
    category's own peak, the module and phase at the peak. The engine's module, the client AdamW
    (its states), and the batch (the m micro-batches are views of one [m, seq] tensor of ids;
    the last stage's labels are those same tensors, ``Tensor.to`` on their own device) are
    registered before the step. The PipelineModule is called once per micro-batch inside one
    step; MemTracker would take its second call for the next iteration, so the tracker handles it
    as validation/measure_pipeline.py's does (no byte count changes).

    The PipelineEngine keeps its own tensors between instructions; they are registered before the
    step and named in these categories (refiled from the tracker's after the instruction that
    makes them; a total never changes, only the category):

    - pipe_inputs: ``pipe_buffers['inputs'][b]``. Stage 0: ``batch[0].clone()``
      (``_exec_load_micro_batch``), int64 [1, seq]; never cleared on stage 0 (only
      ``_exec_send_grads``, which stage 0 never runs, sets a slot to None), so it also persists
      between steps. Stage 1: ``pipe_recv_buf.clone().detach()`` with requires_grad
      (``_exec_recv_activations``), [1, seq, 256] in the model dtype. SendGrad drops the slot, but
      the tensor lives on: the last stage's ``pipe_buffers['outputs'][b]`` (the logits, never
      cleared there) and ``loss`` keep their autograd graphs, whose AccumulateGrad node for this
      leaf keeps it (and its .grad) until the slot's next ForwardPass replaces the logits, and so
      across steps (engine_buffers "graph_leaves(loss, outputs)");
    - pipe_input_grads: the ``.grad`` of stage 1's received inputs (autograd's leaf gradient), sent
      to stage 0 by SendGrad and kept with its input, as above;
    - pipe_forward_inputs: the module's input, a second ``clone()`` of ``pipe_buffers['inputs']``
      made by ``_exec_forward_pass`` ("inputs has no gradient because it is from a cloned tensor");
      it lives as long as the model keeps it (the embedding's indices; the first block's input);
    - pipe_outputs: ``pipe_buffers['outputs'][b]``, the stage's forward output (stage 0 the hidden
      states of block 1, freed after its BackwardPass; stage 1 the logits [1, seq, 4096], which
      ``_exec_backward_pass`` never clears on the last stage (it returns right after
      ``super().backward(self.loss)``): they live until the slot's next forward and across steps,
      with their graphs' nodes, their saved tensors freed);
    - pipe_recv_buffers: ``_grad_layer_buf`` (``_allocate_or_extend_buffers``), the receive buffer
      of both ``pipe_recv_buf`` (stage 1's activations) and ``grad_layer`` (stage 0's gradients),
      allocated by the first step's receive and kept; ``meta_buffer`` (partitioned pipes only);
    - pipe_losses: ``loss``, ``total_loss``, ``fwd_outputs``, ``dp_group_loss``,
      ``agg_train_loss`` (0-d float32 tensors; made in ForwardPass and ``_aggregate_total_loss``).

    and DeepSpeed's optimizer buffers, named as in validation/measure_deepspeed.py:

    - parameters: the module's parameters (views into BF16_Optimizer's ``bf16_groups_flat`` or
      ZeRO's ``bit16_groups_flat``);
    - master_parameters: the fp32 master copy the client AdamW steps (BF16_Optimizer
      ``fp32_groups_flat_partition``; ZeRO ``single_partition_of_fp32_groups``; with one data
      parallel rank, the whole stage);
    - accumulated_gradients: BF16_Optimizer's ``fp32_groups_gradients_flat``, the flat gradient
      accumulation buffer, in the gradient accumulation dtype (bf16 here), kept from initialize;
    - sharded_gradients: ZeRO's ``averaged_gradients`` / ``grads_in_partition``;
    - master_gradients: the fp32 gradient of the master copy made in the optimizer step
      (BF16_Optimizer: ``grad_partition.to(float32)``; ZeRO: ``flat.to(float32)``), filed when the
      client step starts (ZeRO: at ``unscale_and_clip_grads``);
    - gradient_buckets: ZeRO's ipg bucket buffers, ``torch.empty(reduce_bucket_size)`` (5e8
      elements, in the model dtype) each: one from ``setup_buckets`` (zero/stage_1_and_2.py), run
      by the first parameter gradient hook of the step (``grad_handling_hook`` ->
      ``process_gradients``) on both stages, and a second that
      ``reduce_gradients(pipeline_parallel=True)`` appends at ReduceGrads ("with PP we must
      create ipg buffer, since backward is handled outside zero"); both freed by
      ``_release_ipg_buffers`` at the end of that ReduceGrads;
    - reduce_scatter / all_gather: storages first seen in ZeRO's ``reduce_ipg_grads`` /
      ``all_gather_dp_groups``;
    - gradient_allreduce: anything else first seen in ReduceGrads: at ZeRO stage 0
      ``allreduce_gradients`` -> ``buffered_allreduce_fallback`` -> ``allreduce_bucket``
      (runtime/engine.py) flattens every gradient into one new tensor (``self.flatten(bucket)``,
      up to 5e8 elements a bucket), all-reduces it over the one-rank data-parallel group and
      copies it back; BF16_Optimizer's single flat buffer flattens to a view (no copy);
    - step_temp: anything else first seen in OptimizerStep outside the client AdamW's own step;
    - gradients, activations, temp, buffers, optimizer_states, optimizer_temp, other: the
      tracker's own (as measure_steps.py).

    engine_buffers, per stage, gives for each of the engine's named buffer groups (the
    ``pipe_buffers`` lists, the leaves the autograd graphs of ``loss`` and of the outputs keep, the
    receive buffers, the losses, the optimizer wrapper's flat buffers;
    bytes of distinct storages, sampled after every op): "before" (at the start of the measured
    step), "at_peak" (at the stage's peak: sampled at the op that set it, or, as the engine
    stores an op's result only once the op has returned, at the next op or instruction end while
    the total has not moved), "max" (its own largest), "after" (when
    ``train_batch`` has returned: what the engine keeps between steps), and the dtypes and shapes
    at its max. engine_buffer_aliases lists groups that share storages (``pipe_recv_buf`` /
    ``grad_layer`` are views of ``_grad_layer_buf``; ``fwd_outputs`` holds ``loss.detach()``).
    The labels are the batch's own tensors (views of its one storage, category other); the
    first step's tensor-meta buffers (``torch.empty(256, int32)`` in ``_send_tensor_meta`` /
    ``_recv_tensor_meta``) are made only when the shapes are first exchanged, not in the
    measured step.

    One correction, no other: MemTracker's module hooks keep stage 1's received inputs (and
    their gradients) alive after the engine lets them go (without the tracker, a train_batch of
    m = 4 leaves the 2 inputs the logits' graphs reach; with it, all 4). The harness follows the
    engine's own references (``pipe_buffers['inputs']`` and the leaves the graphs of ``loss`` and
    ``pipe_buffers['outputs']`` reach) and takes a received input's storage, and its gradient's,
    out of the count at the first op after the engine drops the last of them, as its deletion
    would; tracker_retained_inputs_released gives how many storages and bytes that was (m = 4:
    the first two micro-batches' inputs and gradients; m = 2: none).

    Each stage's record also has DeepSpeed's instruction list for one ``train_batch``
    (``deepspeed.runtime.pipe.schedule.TrainSchedule(m, 2, stage).steps()``, flattened, in order,
    as the instructions print), ``num_pipe_buffers`` (``TrainSchedule.num_pipe_buffers()``,
    ``max(2, min(stages - stage, m))``: how many ``pipe_buffers`` slots the engine reserves),
    and the instruction (its index in that list) running at the peak; peak_phase is the
    tracker's forward / backward / backward-recompute / optimizer inside the compute and the
    client step, else the instruction's kind (load, p2p, reduce, step) or train_batch (the loss
    aggregation after the schedule).

    Losses: the step loss (``train_batch``'s return, the mean over micro-batches) of both steps,
    against the same model in one process (the same pipe layers in sequence, the same seed, the
    same micro-batches; each micro-batch's loss / m backward, one AdamW step). For bf16-mixed the
    reference mirrors DeepSpeed's: parameters cast to bf16 (buffers kept fp32), gradients summed
    in bf16 over the micro-batches, a float32 copy of them stepping a float32 master with AdamW,
    the master copied back into the bf16 parameters. They must agree within LOSS_TOLERANCE
    (relative, 1e-4) in fp32 and within LOSS_TOLERANCE_BF16 (1e-3) in bf16-mixed.

    Both ranks run every case in one torchrun launch (gloo, ``DS_ACCELERATOR=cpu``, one intra-op
    thread per rank); DeepSpeed's p2p is ``dist.send`` / ``dist.recv``, which gloo carries. All of
    it runs on CPU tensors: byte counts are ``numel * element_size`` (a ``torch.empty`` bucket
    counts in full, as it would on an accelerator), no allocator rounding. DeepSpeed's CPU
    accelerator JIT-builds its shared-memory comm op at the first init (unused by this training).

Output
    A JSON corpus (``--out``) in the layout of oracle_pipeline.json: versions (python, torch,
    deepspeed, transformers), the model config, cases[] (id, pipeline_parallel, world_size,
    schedule, config, micro_batches, seq_len, micro_batch, precision, checkpointing, zero_stage,
    mixed_precision_mechanism, partition_method, optimizer, deepspeed_optimizer (the class
    DeepSpeed wrapped the client AdamW in), deepspeed_config, params, step_losses,
    reference_losses, loss_tolerance, losses_agree, stages[] with stage, layers (the pipe layers'
    classes), layer_range ([start, stop) of the 6 pipe layers), blocks, first, last,
    stage_params, peak_bytes, at_peak, category_peaks, peak_module, peak_phase,
    peak_instruction, end_bytes / at_end (the count and categories when train_batch has
    returned), sdpa_kernel, engine_buffers, engine_buffer_aliases,
    tracker_retained_inputs_released, num_pipe_buffers, instructions), refused (the
    configurations DeepSpeed refuses, with the error each probe got and where DeepSpeed raised
    it) and failures.

Usage
    python validation/measure_deepspeed_pipeline.py \\
        --out tests/costmodel/data/oracle_deepspeed_pipeline.json
    (32 cases, 64 stage records, and the two probes: about 2 minutes on two CPU cores;
    --grid small: m 2, seq 128 only, 8 cases)
"""

import argparse
import copy
import functools
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure_steps as ms  # noqa: E402  (the shared model, batch, tracker and corpus code)
from measure_deepspeed import (DS_CATEGORIES, _flat, _Patches, _scoped,  # noqa: E402
                               bf16_master_grads)

GENERATED_BY = "validation/measure_deepspeed_pipeline.py"
CONFIG = "llama-h256"
PP = 2
SCHEDULE = "deepspeed-train"  # deepspeed.runtime.pipe.schedule.TrainSchedule
PARTITION_METHOD = "parameters"
GRIDS = {
    "base": {"zero_stages": (0, 1), "precisions": ("fp32", "bf16-mixed"),
             "checkpointing": ("none", "full"), "micro_batches": (2, 4), "seq_lens": (128, 256)},
    "small": {"zero_stages": (0, 1), "precisions": ("fp32", "bf16-mixed"),
              "checkpointing": ("none", "full"), "micro_batches": (2,), "seq_lens": (128,)},
}
MICRO_BATCH = 1
LOSS_TOLERANCE = 1e-4  # relative, fp32: pipeline against gradient accumulation in one process
LOSS_TOLERANCE_BF16 = 1e-3  # relative, bf16-mixed: against the one-process bf16 mirror
CHECKPOINTED_LAYERS = ["LlamaDecoderLayerPipe"]

# The engine's categories: the tracker's reference type value -> the corpus name.
PIPE_CATEGORIES = {
    "Pipe Inputs": "pipe_inputs",
    "Pipe Input Grads": "pipe_input_grads",
    "Pipe Forward Inputs": "pipe_forward_inputs",
    "Pipe Outputs": "pipe_outputs",
    "Pipe Recv Buffers": "pipe_recv_buffers",
    "Pipe Losses": "pipe_losses",
    "Accumulated Grad": "accumulated_gradients",
    "Grad All-Reduce": "gradient_allreduce",
}
REF_TYPES = {**DS_CATEGORIES, **PIPE_CATEGORIES}
NAMES = {**ms.CATEGORY_NAMES, **REF_TYPES}
ORDER = ("parameters", "master_parameters", "buffers", "gradients", "accumulated_gradients",
         "sharded_gradients", "master_gradients", "gradient_buckets", "gradient_allreduce",
         "activations", "pipe_forward_inputs", "pipe_inputs", "pipe_input_grads", "pipe_outputs",
         "pipe_recv_buffers", "pipe_losses", "temp", "reduce_scatter", "all_gather", "step_temp",
         "optimizer_states", "optimizer_temp", "other")
# The received inputs and their gradients: storages the tracker stops following once the engine
# no longer holds them (make_tracker, _release_unheld).
INPUT_CATEGORIES = ("Pipe Inputs", "Pipe Input Grads")
ALWAYS = {"parameters", "buffers", "gradients", "activations", "temp", "optimizer_states", "other"}

# Each PipeInstruction's phase where neither autograd nor the client optimizer step runs.
INSTRUCTION_PHASES = {
    "LoadMicroBatch": "load", "ForwardPass": "forward", "BackwardPass": "backward",
    "SendActivation": "p2p", "RecvActivation": "p2p", "SendGrad": "p2p", "RecvGrad": "p2p",
    "ReduceTiedGrads": "reduce", "ReduceGrads": "reduce", "OptimizerStep": "step",
}


# ----------------------------------------------------------------------------------------------
# The grid


def case_grid(grid="base"):
    g = GRIDS[grid]
    for zero_stage in g["zero_stages"]:
        for precision in g["precisions"]:
            for checkpointing in g["checkpointing"]:
                for m in g["micro_batches"]:
                    for seq_len in g["seq_lens"]:
                        yield {"schedule": SCHEDULE, "config": CONFIG, "micro_batches": m,
                               "seq_len": seq_len, "micro_batch": MICRO_BATCH,
                               "precision": precision, "checkpointing": checkpointing,
                               "zero_stage": zero_stage}


def case_id(case):
    return (f"pp{PP}-deepspeed-zero{case['zero_stage']}-m{case['micro_batches']}/"
            f"{case['config']}/{case['precision']}/{case['checkpointing']}/"
            f"s{case['seq_len']}-b{case['micro_batch']}")


def deepspeed_config(case):
    """The config passed to deepspeed.initialize: DeepSpeed's defaults but for these keys."""
    config = {
        "train_micro_batch_size_per_gpu": case["micro_batch"],
        "gradient_accumulation_steps": case["micro_batches"],
        "zero_optimization": {"stage": case["zero_stage"]},
        # ZeRO accepts a client torch.optim.AdamW only with this (is_zero_supported_optimizer).
        "zero_allow_untested_optimizer": True,
    }
    if case["precision"] == "bf16-mixed":
        config["bf16"] = {"enabled": True}
    return config


# ----------------------------------------------------------------------------------------------
# The pipe layers


def _pipe_layer_classes():
    import torch

    class EmbeddingPipe(torch.nn.Module):
        """Token ids -> hidden states: the HF model's embed_tokens."""

        def __init__(self, embed_tokens):
            super().__init__()
            self.embed_tokens = embed_tokens

        def forward(self, ids):
            return self.embed_tokens(ids)

    class LlamaDecoderLayerPipe(torch.nn.Module):
        """One HF LlamaDecoderLayer, called as LlamaModel.forward calls it; the rotary (cos, sin)
        computed here from the hidden states' length, with the HF model's rotary embedding."""

        def __init__(self, layer, rotary_emb):
            super().__init__()
            self.layer = layer
            self.rotary_emb = rotary_emb

        def forward(self, hidden_states):
            pos = torch.arange(hidden_states.shape[1], device=hidden_states.device).unsqueeze(0)
            pe = self.rotary_emb(hidden_states, pos)
            return self.layer(hidden_states, attention_mask=None, position_ids=pos,
                              position_embeddings=pe)

    class LlamaHeadPipe(torch.nn.Module):
        """The final norm and the head: hidden states -> logits."""

        def __init__(self, norm, lm_head):
            super().__init__()
            self.norm = norm
            self.lm_head = lm_head

        def forward(self, hidden_states):
            return self.lm_head(self.norm(hidden_states))

    return EmbeddingPipe, LlamaDecoderLayerPipe, LlamaHeadPipe


_CLASSES = None


def pipe_layers(model):
    """The HF Llama as a list of pipe layers: embedding, one per decoder layer, norm + head."""
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _pipe_layer_classes()
    embedding, block, head = _CLASSES
    base = model.model
    return ([embedding(base.embed_tokens)] +
            [block(layer, base.rotary_emb) for layer in base.layers] +
            [head(base.norm, model.lm_head)])


def loss_fn(logits, labels):
    """torchtitan's cross-entropy (as validation/measure_pipeline.py): the logits upcast to fp32,
    the labels not shifted."""
    import torch

    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def pipeline_module(model, checkpointing, checkpointable_layers=CHECKPOINTED_LAYERS):
    from deepspeed.pipe import PipelineModule

    full = checkpointing == "full"
    return PipelineModule(layers=pipe_layers(model), num_stages=PP, loss_fn=loss_fn,
                          partition_method=PARTITION_METHOD,
                          activation_checkpoint_interval=1 if full else 0,
                          checkpointable_layers=checkpointable_layers if full else None)


def micro_batches(case):
    """The m micro-batches (ids, labels = ids), views of one [m, seq] batch (the same on every
    rank)."""
    ids = ms.make_batch(case["config"], case["seq_len"],
                        case["micro_batch"] * case["micro_batches"], 0)
    return ids, [(x, x) for x in ids.tensor_split(case["micro_batches"], dim=0)]


# ----------------------------------------------------------------------------------------------
# The engine's buffers


def graph_leaves(engine, cache):
    """The tensors other than parameters that the autograd graphs of ``engine.loss`` and of
    ``pipe_buffers['outputs']`` keep through their AccumulateGrad nodes (the last stage's
    received inputs, with their .grad), found once per root tensor."""
    import torch
    import weakref

    params = cache.setdefault("params", {id(p) for p in engine.module.parameters()})
    found = cache.setdefault("roots", {})
    roots = [t for t in [engine.loss, *_flat(engine.pipe_buffers["outputs"])]
             if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    live = {}
    for root in roots:
        held = found.get(id(root))
        if held is None or held[0]() is not root:
            leaves, seen, stack = [], set(), [root.grad_fn]
            while stack:
                node = stack.pop()
                if node is None or node in seen:
                    continue
                seen.add(node)
                variable = getattr(node, "variable", None)
                if isinstance(variable, torch.Tensor) and id(variable) not in params:
                    leaves.append(weakref.ref(variable))
                stack.extend(f for f, _ in node.next_functions)
            held = (weakref.ref(root), leaves)
        live[id(root)] = held
    cache["roots"] = live
    out = {}
    for _root, leaves in live.values():
        for ref in leaves:
            t = ref()
            if t is not None:
                out[id(t)] = t
    return list(out.values())


def engine_buffer_groups(engine, cache=None):
    """[(name, category value or None, [tensors])] of the buffers the PipelineEngine and its
    optimizer wrapper hold now (category None: not the engine's own storage)."""
    pb = engine.pipe_buffers
    inputs = _flat(pb["inputs"])
    leaves = graph_leaves(engine, {} if cache is None else cache)
    groups = [
        ("pipe_buffers.inputs", "Pipe Inputs", inputs),
        ("pipe_buffers.inputs.grad", "Pipe Input Grads",
         [t.grad for t in inputs if t.is_leaf and t.grad is not None]),
        ("graph_leaves(loss, outputs)", "Pipe Inputs", leaves),
        ("graph_leaves(loss, outputs).grad", "Pipe Input Grads",
         [t.grad for t in leaves if t.grad is not None]),
        ("pipe_buffers.labels", None, _flat(pb["labels"])),
        ("pipe_buffers.outputs", "Pipe Outputs", _flat(pb["outputs"])),
        ("pipe_buffers.output_tensors", "Pipe Outputs", _flat(pb["output_tensors"])),
        ("pipe_recv_buf", "Pipe Recv Buffers", _flat(engine.pipe_recv_buf)),
        ("grad_layer", "Pipe Recv Buffers", _flat(engine.grad_layer)),
        ("_grad_layer_buf", "Pipe Recv Buffers", _flat(engine._grad_layer_buf)),
        ("meta_buffer", "Pipe Recv Buffers", _flat(engine.meta_buffer)),
        ("loss", "Pipe Losses", _flat(engine.loss)),
        ("total_loss", "Pipe Losses", _flat(engine.total_loss)),
        ("fwd_outputs", "Pipe Losses", _flat(getattr(engine, "fwd_outputs", None))),
        ("dp_group_loss", "Pipe Losses", _flat(engine.dp_group_loss)),
        ("agg_train_loss", "Pipe Losses", _flat(engine.agg_train_loss)),
    ]
    opt = engine.optimizer
    name = type(opt).__name__
    if name == "BF16_Optimizer":
        groups += [
            ("bf16_groups_flat", "Parameter", _flat(opt.bf16_groups_flat)),
            ("fp32_groups_flat_partition", "Master Param", _flat(opt.fp32_groups_flat_partition)),
            ("fp32_groups_gradients_flat", "Accumulated Grad",
             _flat(opt.fp32_groups_gradients_flat)),
            ("fp32_groups_flat_partition.grad", "Master Grad",
             [p.grad for p in opt.fp32_groups_flat_partition if p.grad is not None]),
        ]
    elif name == "DeepSpeedZeroOptimizer":
        groups += [
            ("bit16_groups_flat", "Parameter", _flat(opt.bit16_groups_flat)),
            ("single_partition_of_fp32_groups", "Master Param",
             _flat(opt.single_partition_of_fp32_groups)),
            ("single_partition_of_fp32_groups.grad", "Master Grad",
             [p.grad for p in opt.single_partition_of_fp32_groups if p.grad is not None]),
            ("grads_in_partition", "Sharded Grad",
             _flat(getattr(opt, "grads_in_partition", None))),
            ("averaged_gradients", "Sharded Grad",
             _flat(getattr(opt, "averaged_gradients", None))),
        ]
        buckets = getattr(opt, "ipg_buckets", {})
        for dtype, bucket in sorted(buckets.items(), key=lambda kv: str(kv[0])):
            groups.append((f"ipg_buckets[{str(dtype).replace('torch.', '')}].buffer",
                           "Gradient Buckets", _flat(getattr(bucket, "buffer", None))))
    return groups


def _storages(tensors):
    """{storage data pointer: (bytes, tensor)} of the tensors, empty ones skipped."""
    out = {}
    for t in tensors:
        st = t.untyped_storage()
        if st.nbytes() > 0:
            out.setdefault(st.data_ptr(), (st.nbytes(), t))
    return out


def _describe(t):
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


class BufferSampler:
    """Bytes of each engine buffer group: now, at the stage's peak, their own maxima."""

    def __init__(self, engine):
        self.engine = engine
        self.cache = {}
        self.names = [name for name, _c, _t in engine_buffer_groups(engine, self.cache)]
        self.max = {}
        self.max_tensors = {}
        self.at_peak = {}
        self.aliases = []
        self.held_inputs = set()  # storages of the groups in INPUT_CATEGORIES, now

    def sample(self):
        out = {}
        owner = {}
        held = set()
        for name, category, tensors in engine_buffer_groups(self.engine, self.cache):
            stores = _storages(tensors)
            if category in INPUT_CATEGORIES:
                held.update(stores)
            nbytes = sum(b for b, _t in stores.values())
            out[name] = nbytes
            if name not in self.names:
                self.names.append(name)
            if nbytes > self.max.get(name, -1):
                self.max[name] = nbytes
                self.max_tensors[name] = [_describe(t) for _b, t in stores.values()]
            for ptr in stores:
                if ptr in owner and owner[ptr] != name and [owner[ptr], name] not in self.aliases:
                    self.aliases.append([owner[ptr], name])
                owner.setdefault(ptr, name)
        self.held_inputs = held
        return out


# ----------------------------------------------------------------------------------------------
# Tracker


def make_tracker(engine, client_optimizer, batch):
    """MemTracker + _PeakProbe with DeepSpeed's and the pipe engine's categories, the
    PipelineModule's once-per-micro-batch forward, the instruction at the peak, and the engine's
    buffer groups sampled after every op."""
    import weakref

    from torch.distributed._tools.common_utils import get_untyped_storages
    from torch.distributed._tools.mem_tracker import (MemTracker, _MemRefType, _ModState, _RefType,
                                                      _UpdateType)

    ds_ref = _RefType("PipeRefType", [(k.upper().replace(" ", "_"), k) for k in REF_TYPES])
    by_value = {m.value: m for m in ds_ref}
    by_value.update({"Parameter": _MemRefType.PARAM, "Optstate": _MemRefType.OPT})

    class PipeMemTracker(ms._PeakProbe, MemTracker):

        def _pipe_init(self, engine):
            self.ds_override = []  # reference type for storages first seen, innermost last
            self.instruction = None  # (index, repr, kind) of the instruction running
            self.peak_instruction = None
            self.sampler = BufferSampler(engine)
            self.buffers_now = {}
            self.input_storages = {}  # data pointer -> weakref to a received input's storage
            self.released = {"storages": 0, "bytes": 0}
            self.peak_pending = None  # the total at the op that set the peak, until resampled

        def reftype(self, value):
            return by_value[value]

        def _phase(self):
            if self._in_opt:
                return "optimizer"
            if self._mod_tracker.is_bw:
                return "backward-recompute" if self._in_ac else "backward"
            if self.instruction is None:
                return "train_batch"
            return INSTRUCTION_PHASES.get(self.instruction[2], self.instruction[2])

        def _track(self, reftype, t):
            if self.ds_override and not self._in_opt:
                reftype = self.ds_override[-1]
            MemTracker._track(self, reftype, t)

        def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None):
            dev_snap = self._curr_mem_snap.setdefault(winfo.device,
                                                      dict.fromkeys(self._ref_class, 0))
            dev_snap.setdefault(winfo.reftype, 0)
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)

        def _update_and_maybe_create_winfos(self, t, reftype, update_existing=False):
            # The tracker's own refiling (parameters at a module's first forward, gradients in
            # its hooks) leaves the engine's storages where this harness put them.
            if not isinstance(reftype, ds_ref):
                for st in get_untyped_storages(t):
                    winfo, _ = self._WINFO.get(st, (None, None))
                    if winfo is not None and isinstance(winfo.reftype, ds_ref):
                        return set()
            return super()._update_and_maybe_create_winfos(t, reftype, update_existing)

        def file_under(self, reftype, tensors):
            """Registers (or refiles) the storages of `tensors` under `reftype`."""
            for t in tensors:
                if t is not None and t.untyped_storage().nbytes() > 0:
                    MemTracker._update_and_maybe_create_winfos(self, t, reftype)

        def claim(self, reftype, tensors):
            """Files under `reftype` the storages not yet in one of the engine's categories."""
            for t in tensors:
                if t is None or t.untyped_storage().nbytes() == 0:
                    continue
                if reftype.value in INPUT_CATEGORIES:
                    st = t.untyped_storage()
                    self.input_storages[st.data_ptr()] = weakref.ref(st)
                winfo, _ = self._WINFO.get(t.untyped_storage(), (None, None))
                if winfo is None or not isinstance(winfo.reftype, ds_ref):
                    MemTracker._update_and_maybe_create_winfos(self, t, reftype)

        def claim_engine_buffers(self):
            """Files every engine buffer group's storages under its category (first wins)."""
            for _name, category, tensors in engine_buffer_groups(self.sampler.engine,
                                                                 self.sampler.cache):
                if category is not None:
                    self.claim(self.reftype(category), tensors)

        def _release_unheld(self):
            """Stops following received inputs (and their gradients) the engine holds no more.

            With ModTracker's hooks installed (MemTracker runs them), stage 1's received inputs
            all outlive the step: checked without MemTracker, after a train_batch of m = 4 only
            the two that the graphs of ``pipe_buffers['outputs']`` reach are alive, under a bare
            ModTracker all four (its multi-grad hooks on the modules' inputs, registered by
            register_multi_grad_hook in torch/autograd/graph.py, keep the graph nodes that lead
            to the AccumulateGrad of each received input). The engine frees such an input once
            neither ``pipe_buffers['inputs']`` nor the graphs of ``loss`` and
            ``pipe_buffers['outputs']`` reach it; from that op on its storage (and its .grad's) is
            out of the count, as its deletion would take it, before the op's peak is taken."""
            for ptr, ref in list(self.input_storages.items()):
                st = ref()
                if st is None:
                    del self.input_storages[ptr]
                    continue
                if ptr in self.sampler.held_inputs:
                    continue
                del self.input_storages[ptr]
                winfo, _ = self._WINFO.get(st, (None, None))
                if winfo is None or getattr(winfo.reftype, "value", None) not in INPUT_CATEGORIES:
                    continue
                if winfo.mem_consumed > 0:
                    self._update_snap(_UpdateType.DEL, winfo)
                del self._WINFO[st]
                self.released["storages"] += 1
                self.released["bytes"] += winfo.mem_consumed

        def _total(self):
            return sum(snap["Total"] for snap in self._curr_mem_snap.values())

        def refresh_peak_sample(self, sample):
            """The engine assigns an op's result (a new bucket appended to its list, a slot of
            pipe_buffers) only after the op returns, so the groups sampled at the op that set the
            peak may miss it: while the total has not moved since, a later sample stands for the
            peak."""
            if self.peak_pending is not None and self._total() == self.peak_pending:
                self.sampler.at_peak = dict(sample)
            self.peak_pending = None

        def _update_peak_stats(self, peak_state):
            self.buffers_now = self.sampler.sample()
            self._release_unheld()
            self.refresh_peak_sample(self.buffers_now)
            before = [held for held, _snap in self.held_peak.values()]
            super()._update_peak_stats(peak_state)
            if [held for held, _snap in self.held_peak.values()] != before:
                self.sampler.at_peak = dict(self.buffers_now)
                self.peak_instruction = self.instruction
                self.peak_pending = self._total()

        def _pre_fw_hook(self, module, inputs):
            # The PipelineModule runs once per micro-batch in one step: its second forward is
            # handled as MemTracker handles a submodule called again in one iteration
            # (validation/measure_pipeline.py, make_tracker).
            name = self._mod_tracker.get_known_fqn(module)
            again = (module in self.memory_tracking and not self._mod_tracker.is_bw and
                     set(self._mod_tracker.parents) - {name} == {"Global"})
            if not again:
                return super()._pre_fw_hook(module, inputs)
            mod_stats = self.memory_tracking[module]
            mod_stats.input_mem = self._track_inputs_or_outputs(inputs)
            snapshot = self.get_tracker_snapshot()
            mod_stats.local_peak = {dev: snap["Total"] for dev, snap in snapshot.items()}
            mod_stats.snapshots.setdefault(_ModState.PEAK_FW, []).append(snapshot)
            mod_stats.snapshots.setdefault(_ModState.PRE_FW, []).append(copy.deepcopy(snapshot))
            return None

    tracker = PipeMemTracker()
    tracker._pipe_init(engine)
    tracker.track_external(engine.module, client_optimizer, batch)
    tracker.claim_engine_buffers()
    tracker._probe_init()
    return tracker


def classify_engine(tracker, engine, client_optimizer, instructions):
    """Wraps the engine's instructions and DeepSpeed's optimizer functions for the measured step
    (phases, the categories of what they make, the instruction running); returns the patches."""
    import deepspeed.runtime.pipe.engine as pipe_engine
    from deepspeed.runtime.utils import call_to_str

    patches = _Patches()
    ref = tracker.reftype
    counter = iter(range(len(instructions) + 1))
    kinds = {"LoadMicroBatch": "Pipe Inputs", "RecvActivation": "Pipe Inputs",
             "ReduceGrads": "Grad All-Reduce", "ReduceTiedGrads": "Grad All-Reduce",
             "OptimizerStep": "Step Temp"}

    def instruction(kind, original):
        def run(self, **kwargs):
            index = next(counter)
            text = call_to_str(kind, **kwargs)
            if index >= len(instructions) or instructions[index] != text:
                raise RuntimeError(f"instruction {index} ran as {text}, the schedule has "
                                   f"{instructions[index] if index < len(instructions) else None}")
            tracker.instruction = (index, text, kind)
            override = kinds.get(kind)
            if override:
                tracker.ds_override.append(ref(override))
            try:
                return original(self, **kwargs)
            finally:
                if override:
                    tracker.ds_override.pop()
                tracker.claim_engine_buffers()
                tracker.refresh_peak_sample(tracker.sampler.sample())
                tracker.instruction = None
        return run

    # PipelineEngine._INSTRUCTION_MAP: PipeInstruction class -> the method _exec_schedule runs.
    table = pipe_engine.PipelineEngine._INSTRUCTION_MAP
    saved = dict(table)
    for cls, method in saved.items():
        table[cls] = instruction(cls.__name__, method)

    scoped = functools.partial(_scoped, tracker)

    patches.wrap(engine, "_aggregate_total_loss", scoped(ref("Pipe Losses")))

    # The module's input is _exec_forward_pass's clone of pipe_buffers['inputs'].
    def forward_input(_module, args):
        tracker.file_under(ref("Pipe Forward Inputs"), _flat(args))
    handle = engine.module.register_forward_pre_hook(forward_input)

    optimizer = engine.optimizer
    if type(optimizer).__name__ == "BF16_Optimizer":
        patches.wrap(client_optimizer, "step",
                     bf16_master_grads(tracker, optimizer, ref("Master Grad")))
    elif type(optimizer).__name__ == "DeepSpeedZeroOptimizer":
        import deepspeed.runtime.zero.stage_1_and_2 as s12

        patches.wrap(optimizer, "setup_buckets", scoped(ref("Gradient Buckets")))
        patches.wrap(optimizer, "reduce_gradients", scoped(ref("Gradient Buckets")))
        patches.wrap(optimizer, "copy_grads_in_partition", scoped(ref("Sharded Grad")))
        patches.wrap(optimizer, "reduce_ipg_grads", scoped(ref("Reduce Scatter")))
        patches.wrap(s12, "all_gather_dp_groups", scoped(ref("All Gather")))

        def master_grad(original):
            def wrapper(grad_groups_flat, *args, **kwargs):
                tracker.file_under(ref("Master Grad"), grad_groups_flat)
                return original(grad_groups_flat, *args, **kwargs)
            return wrapper
        patches.wrap(optimizer, "unscale_and_clip_grads", master_grad)
    return patches, handle, table, saved


def read_tracker(tracker, state_bytes, end_snap):
    if len(tracker.held_peak) != 1:
        raise RuntimeError(f"expected one device, the tracker saw {list(tracker.held_peak)}")
    (dev, (held, snap)), = tracker.held_peak.items()

    def categories(s):
        out = {}
        for k, v in s.items():
            name = getattr(k, "value", k)
            if name != "Total":
                out[NAMES.get(name, name)] = out.get(NAMES.get(name, name), 0) + int(v)
        return out

    at_peak = ms.split_optimizer(categories(snap), state_bytes)
    own_peaks = ms.split_optimizer(categories(tracker.category_peaks[dev]), state_bytes)
    at_end = ms.split_optimizer(categories(end_snap), state_bytes)
    keys = ({k for k, v in at_peak.items() if v} | {k for k, v in own_peaks.items() if v} |
            {k for k, v in at_end.items() if v} | ALWAYS)
    return {
        "peak_bytes": int(held),
        "at_peak": ms.in_category_order(at_peak, keys, ORDER),
        "category_peaks": ms.in_category_order(own_peaks, keys, ORDER),
        "peak_module": tracker.peak_where[0],
        "peak_phase": tracker.peak_where[1],
        "end_bytes": int(end_snap["Total"]),
        "at_end": ms.in_category_order(at_end, keys, ORDER),
    }


# ----------------------------------------------------------------------------------------------
# One case, one rank


def schedule_instructions(m, stage):
    """DeepSpeed's TrainSchedule for one train_batch on `stage`, flattened, as each prints."""
    from deepspeed.runtime.pipe.schedule import TrainSchedule

    sched = TrainSchedule(micro_batches=m, stages=PP, stage_id=stage)
    return [repr(cmd) for step in sched.steps() for cmd in step], sched.num_pipe_buffers()


def train_batch(engine, batches):
    return float(engine.train_batch(iter(batches)))


def measure_case(rank, case):
    import deepspeed

    model = ms.build_model(case["config"], "none")
    params = ms.parameter_count(model)
    module = pipeline_module(model, case["checkpointing"])
    del model
    stage = module.stage_id
    client_optimizer = ms.make_optimizer(module)
    config = deepspeed_config(case)
    engine, _, _, _ = deepspeed.initialize(model=module, optimizer=client_optimizer,
                                           config=json.loads(json.dumps(config)))
    wrapper = type(engine.optimizer).__name__
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    if inner is not client_optimizer:
        raise RuntimeError(f"unexpected optimizer wrapping: {wrapper}")
    instructions, num_pipe_buffers = schedule_instructions(case["micro_batches"], stage)
    ids, batches = micro_batches(case)
    first_loss = train_batch(engine, batches)
    if engine.num_pipe_buffers != num_pipe_buffers:
        raise RuntimeError(f"engine reserved {engine.num_pipe_buffers} pipe buffers, the "
                           f"schedule says {num_pipe_buffers}")
    gc.collect()

    tracker = make_tracker(engine, client_optimizer, ids)
    before = tracker.sampler.sample()
    patches, handle, table, saved = classify_engine(tracker, engine, client_optimizer, instructions)
    try:
        with tracker:
            second_loss = train_batch(engine, batches)
    finally:
        handle.remove()
        table.update(saved)
        patches.restore()
    after = tracker.sampler.sample()
    (_dev, end_snap), = tracker.get_tracker_snapshot().items()
    sampler = tracker.sampler
    engine_buffers = {
        name: {"before": before.get(name, 0), "at_peak": sampler.at_peak.get(name, 0),
               "max": sampler.max.get(name, 0), "after": after.get(name, 0),
               "tensors_at_max": sampler.max_tensors.get(name, [])}
        for name in sampler.names}
    peak_instruction = tracker.peak_instruction
    layers = [type(f).__name__ for f in module.forward_funcs]
    record = {
        "stage": stage,
        "layers": layers,
        "layer_range": [int(module._local_start), int(module._local_stop)],
        "blocks": layers.count("LlamaDecoderLayerPipe"),
        "first": engine.is_first_stage(),
        "last": engine.is_last_stage(),
        "params": params,
        "stage_params": sum(p.numel() for p in module.parameters()),
        "deepspeed_optimizer": wrapper,
        **read_tracker(tracker, ms.optimizer_state_bytes(client_optimizer), end_snap),
        "peak_instruction": ({"index": peak_instruction[0], "instruction": peak_instruction[1]}
                             if peak_instruction else None),
        "sdpa_kernel": ",".join(sorted(tracker.sdpa_kernels)),
        "engine_buffers": engine_buffers,
        "engine_buffer_aliases": sampler.aliases,
        "tracker_retained_inputs_released": dict(tracker.released),
        "num_pipe_buffers": num_pipe_buffers,
        "instructions": instructions,
    }
    if engine.is_last_stage():
        ref = reference_losses(case, batches, 2)
        tol = LOSS_TOLERANCE_BF16 if case["precision"] == "bf16-mixed" else LOSS_TOLERANCE
        record["step_losses"] = [round(first_loss, 5), round(second_loss, 5)]
        record["reference_losses"] = [round(x, 5) for x in ref]
        record["loss_tolerance"] = tol
        record["losses_agree"] = all(
            abs(a - b) <= tol * abs(b) for a, b in zip((first_loss, second_loss), ref))
    del tracker, engine, client_optimizer, module
    gc.collect()
    return record


def reference_losses(case, batches, steps):
    """The same pipe layers in sequence in one process: each micro-batch's loss / m backward (the
    engine's scaling by gradient_accumulation_steps), one AdamW step; the mean loss of each step.
    bf16-mixed mirrors DeepSpeed's: bf16 parameters (fp32 buffers), gradients summed in bf16, an
    fp32 copy of them stepping an fp32 master, copied back into the parameters."""
    import torch

    model = ms.build_model(case["config"], "none")
    whole = torch.nn.Sequential(*pipe_layers(model))
    params = list(whole.parameters())
    bf16 = case["precision"] == "bf16-mixed"
    if bf16:
        for p in params:
            p.data = p.data.to(torch.bfloat16)
        masters = [p.detach().float().requires_grad_() for p in params]
        optimizer = torch.optim.AdamW(masters, lr=1e-3, foreach=True)
    else:
        optimizer = torch.optim.AdamW(params, lr=1e-3, foreach=True)
    m = len(batches)
    out = []
    for _ in range(steps):
        losses = []
        for x, y in batches:
            loss = loss_fn(whole(x), y)
            (loss / m).backward()
            losses.append(float(loss.detach()))
        if bf16:
            for p, master in zip(params, masters):
                master.grad = p.grad.float()
                p.grad = None
            optimizer.step()
            with torch.no_grad():
                for p, master in zip(params, masters):
                    p.copy_(master)
            optimizer.zero_grad(set_to_none=True)
        else:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        out.append(sum(losses) / m)
    return out


def worker_main(out_path, grid):
    import logging

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    import deepspeed
    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.WARNING)
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    records, errors = [], []
    for case in case_grid(grid):
        t0 = time.time()
        try:
            records.append(dict(measure_case(rank, case), id=case_id(case)))
        except Exception as e:  # record it and go on
            errors.append({"id": case_id(case), "error": f"{type(e).__name__}: {e}"[:500]})
            if len(errors) == 1:
                import traceback
                traceback.print_exc()
        torch.distributed.barrier()
        print(f"rank {rank} {case_id(case)}: {time.time() - t0:.1f} s", flush=True)
    with open(out_path, "w") as f:
        json.dump({"rank": rank, "records": records, "errors": errors}, f)
    torch.distributed.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# Refused configurations


PROBES = {
    "zero-stage-2": {
        "what": "ZeRO stage 2 under PipelineEngine (fp32, m 2, seq 128)",
        "case": {"schedule": SCHEDULE, "config": CONFIG, "micro_batches": 2, "seq_len": 128,
                 "micro_batch": MICRO_BATCH, "precision": "fp32", "checkpointing": "none",
                 "zero_stage": 2},
        "checkpointable_layers": CHECKPOINTED_LAYERS,
    },
    "default-checkpointable-layers": {
        "what": ("activation_checkpoint_interval=1 with PipelineModule's default "
                 "checkpointable_layers=None (every layer with parameters checkpointed, the "
                 "embedding included; fp32, ZeRO 0, m 2, seq 128)"),
        "case": {"schedule": SCHEDULE, "config": CONFIG, "micro_batches": 2, "seq_len": 128,
                 "micro_batch": MICRO_BATCH, "precision": "fp32", "checkpointing": "full",
                 "zero_stage": 0},
        "checkpointable_layers": None,
    },
}
PROBE_MARK = "PROBE-ERROR "


def probe_main(name):
    """Builds the probe's engine and trains one batch; prints the error it gets (a failing rank
    leaves its peer blocked in a receive, so the rank that fails ends the launch)."""
    import logging

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    import deepspeed
    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.WARNING)
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    probe = PROBES[name]
    case = probe["case"]
    try:
        model = ms.build_model(case["config"], "none")
        module = pipeline_module(model, case["checkpointing"], probe["checkpointable_layers"])
        optimizer = ms.make_optimizer(module)
        engine, _, _, _ = deepspeed.initialize(model=module, optimizer=optimizer,
                                               config=deepspeed_config(case))
        _ids, batches = micro_batches(case)
        train_batch(engine, batches)
    except Exception as e:
        import traceback

        frames = [f for f in traceback.extract_tb(e.__traceback__) if "deepspeed" in f.filename]
        where = ""
        if frames:
            f = frames[-1]
            where = f"{f.filename.split('site-packages/')[-1]}:{f.lineno} ({f.name})"
        message = " ".join(f"{type(e).__name__}: {e}".split())
        print(PROBE_MARK + json.dumps({"rank": torch.distributed.get_rank(), "error": message,
                                       "raised_at": where}), flush=True)
        os._exit(3)
    print(PROBE_MARK + json.dumps({"error": None}), flush=True)
    torch.distributed.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# Launcher


def torchrun(args, log_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={PP}", os.path.abspath(__file__), *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    with open(log_path, "w") as log:
        return subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode


def run_probes(tmpdir):
    """Each probe in its own launch; the error DeepSpeed raised (first rank to report it)."""
    refused = []
    for name, probe in PROBES.items():
        log = os.path.join(tmpdir, f"probe-{name}.log")
        rc = torchrun(["--probe", name], log)
        with open(log) as f:
            reports = [json.loads(line.split(PROBE_MARK, 1)[1]) for line in f
                       if PROBE_MARK in line]
        errors = [r for r in reports if r.get("error")]
        refused.append({
            "probe": name,
            "what": probe["what"],
            "deepspeed_config": deepspeed_config(probe["case"]),
            "refused": bool(errors),
            "error": errors[0]["error"] if errors else None,
            "raised_at": errors[0]["raised_at"] if errors else None,
            "exit_status": rc,
        })
        print(f"probe {name}: {'refused' if errors else 'accepted'} (exit {rc})", flush=True)
    return refused


def merge_stages(files, grid):
    """One case per grid point, its stages' records in stage order; a case any rank failed, or
    whose losses disagree with the reference, is a failure."""
    results = []
    for path in files:
        with open(path) as f:
            results.append(json.load(f))
    by_rank = [{r["id"]: r for r in res["records"]} for res in results]
    failures = {e["id"]: e["error"] for res in results for e in res["errors"]}
    cases = []
    for case in case_grid(grid):
        cid = case_id(case)
        if cid in failures:
            continue
        stages = sorted((ranks[cid] for ranks in by_rank), key=lambda s: s["stage"])
        for s in stages:
            s.pop("id")
        last = stages[-1]
        wrappers = {s.pop("deepspeed_optimizer") for s in stages}
        bf16 = case["precision"] == "bf16-mixed"
        record = {"id": cid, "pipeline_parallel": PP, "world_size": PP, **case,
                  "mixed_precision_mechanism": "deepspeed-bf16" if bf16 else "none",
                  "partition_method": PARTITION_METHOD, "optimizer": "adamw",
                  "deepspeed_optimizer": ",".join(sorted(wrappers)),
                  "deepspeed_config": deepspeed_config(case),
                  "params": last.pop("params"),
                  "step_losses": last.pop("step_losses"),
                  "reference_losses": last.pop("reference_losses"),
                  "loss_tolerance": last.pop("loss_tolerance"),
                  "losses_agree": last.pop("losses_agree")}
        for s in stages:
            s.pop("params", None)
        record["stages"] = stages
        if not record["losses_agree"]:
            failures[cid] = (f"pipeline losses {record['step_losses']} differ from the "
                             f"reference's {record['reference_losses']}")
        cases.append(record)
    return cases, failures


def versions():
    import importlib.metadata

    return {**ms.versions(), "deepspeed": importlib.metadata.version("deepspeed")}


def write_corpus(out, cases, failures, refused, command, grid):
    doc = {
        "schema_version": ms.SCHEMA_VERSION,
        "generated_by": GENERATED_BY,
        "command": command,
        "versions": versions(),
        "configs": {CONFIG: ms.CONFIGS[CONFIG]},
        "grid": {k: list(v) for k, v in GRIDS[grid].items()},
        "cases": cases,
        "refused": refused,
        "failures": [{"id": k, "error": v} for k, v in sorted(failures.items())],
    }
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/costmodel/data/oracle_deepspeed_pipeline.json")
    ap.add_argument("--grid", choices=sorted(GRIDS), default="base",
                    help="the cases to measure (small: m 2, seq 128 only, a quick check)")
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--probe", choices=sorted(PROBES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:
        probe_main(args.probe)
        return 0
    if args.worker_out:
        worker_main(args.worker_out.format(rank=os.environ.get("RANK", "0")), args.grid)
        return 0
    started = time.time()
    with tempfile.TemporaryDirectory() as tmpdir:
        stem = os.path.join(tmpdir, "pp")
        rc = torchrun(["--grid", args.grid, "--worker-out", stem + "-r{rank}.json"],
                      stem + ".log")
        files = [stem + f"-r{r}.json" for r in range(PP)]
        if rc != 0 or not all(os.path.exists(p) for p in files):
            with open(stem + ".log") as f:
                print(f.read()[-4000:])
            return 1
        cases, failures = merge_stages(files, args.grid)
        print(f"{len(cases)} cases measured in {time.time() - started:.0f} s", flush=True)
        refused = run_probes(tmpdir)
    out = os.path.relpath(args.out)
    command = " ".join(["python", GENERATED_BY, "--out",
                        out if not out.startswith("..") else os.path.basename(out)])
    if args.grid != "base":
        command += f" --grid {args.grid}"
    write_corpus(args.out, cases, failures, refused, command, args.grid)
    return ms.report(args.out, cases, failures, [], started)


if __name__ == "__main__":
    sys.exit(main())
