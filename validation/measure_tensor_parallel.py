#!/usr/bin/env python3
"""Measure the memory of tensor-parallel training steps with PyTorch's own TP and trackers.

What it measures
    One training step of ``transformers.LlamaForCausalLM`` (the llama-h256 config of
    validation/measure_steps.py, float32, dropout 0, sdpa attention) on 2 ranks (gloo, CPU), both
    ranks one tensor-parallel group (t = 2, no data parallelism), under
    ``torch.optim.AdamW(lr=1e-3, foreach=True)``, in two layouts:

    - "hf": transformers' own plan for Llama (``LlamaConfig.base_model_tp_plan`` and
      ``LlamaForCausalLM._tp_plan``): q/k/v and gate/up ``colwise``, o and down ``rowwise``, the
      head ``colwise_gather_output`` (every rank gets the whole logits); the embedding and the
      norms are not split (replicated); the model's own loss (upcast to fp32). As
      ``torch.distributed.tensor.parallel`` styles: ColwiseParallel(), RowwiseParallel(),
      ColwiseParallel(output_layouts=Replicate()). The replicated parameters are plain tensors
      beside DTensors, which foreach AdamW cannot mix in one group: they get a param group of
      their own (same hyperparameters).
    - "sp": the layout torchtitan applied to Llama before its 0.3 rewrite, with sequence
      parallelism: the embedding RowwiseParallel (vocabulary rows split, output Shard(1) on the
      sequence), every RMSNorm SequenceParallel, attention and MLP inputs all-gathered
      (PrepareModuleInput Shard(1) -> Replicate), o and down RowwiseParallel(output_layouts=
      Shard(1)) (a reduce-scatter), and the head ColwiseParallel(input_layouts=Shard(1),
      output_layouts=Shard(-1)) with the loss computed under ``loss_parallel()`` (logits stay split
      over the vocabulary): ``cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))``
      as torchtitan's loss does.

    The grid: seq 128/256 x micro-batch 1/2 x checkpointing none/full (HF's non-reentrant
    gradient checkpointing) x the two layouts. Position ids are passed explicitly (under sequence
    parallelism the embedding's output holds half the sequence, from which the model would
    otherwise derive them).

How it measures
    As validation/measure_steps.py: ``MemTracker`` over the second step, after one warm-up step,
    with the parameters, optimizer and batch registered, storage bytes per category, the
    categories at the peak and each one's own peak. DTensors are counted by their local shards.
    Each record also has the loss, and the loss of the same model and batch in one process
    without TP (they must agree: the layouts are the same model).

Usage
    python validation/measure_tensor_parallel.py --out tests/costmodel/data/oracle_tensor_parallel.json
"""

import argparse
import gc
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure_steps as ms  # noqa: E402  (the shared model, batch, tracker and corpus code)

GENERATED_BY = "validation/measure_tensor_parallel.py"
CONFIG = "llama-h256"
TP = 2
LAYOUTS = ("hf", "sp")
SEQ_LENS = (128, 256)
MICRO_BATCHES = (1, 2)
CHECKPOINTING = ("none", "full")


def case_grid():
    for layout in LAYOUTS:
        for checkpointing in CHECKPOINTING:
            for seq_len in SEQ_LENS:
                for micro_batch in MICRO_BATCHES:
                    yield {"layout": layout, "config": CONFIG, "seq_len": seq_len,
                           "micro_batch": micro_batch, "precision": "fp32",
                           "checkpointing": checkpointing}


def case_id(case):
    return (f"tp{TP}-{case['layout']}/{case['config']}/fp32/{case['checkpointing']}/"
            f"s{case['seq_len']}-b{case['micro_batch']}")


def apply_tp(model, mesh, layout):
    """The layout's parallel styles on the HF Llama module tree (see the module docstring)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    sp = layout == "sp"
    act = Shard(1) if sp else Replicate()
    top = {"lm_head": ColwiseParallel(input_layouts=act, output_layouts=Shard(-1),
                                      use_local_output=False) if sp
           else ColwiseParallel(output_layouts=Replicate())}
    if sp:
        top["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=act)
        top["model.norm"] = SequenceParallel()
    parallelize_module(model, mesh, top)
    for layer in model.model.layers:
        plan = {
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=act),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=act),
        }
        if sp:
            plan["input_layernorm"] = SequenceParallel()
            plan["post_attention_layernorm"] = SequenceParallel()
            plan["self_attn"] = PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": act},
                desired_input_kwarg_layouts={"hidden_states": Replicate()})
            plan["mlp"] = PrepareModuleInput(input_layouts=(act,),
                                             desired_input_layouts=(Replicate(),))
        parallelize_module(layer, mesh, plan)
    return model


def make_optimizer(model):
    """foreach AdamW; DTensor parameters and plain ones in separate groups (foreach cannot mix)."""
    import torch
    from torch.distributed.tensor import DTensor

    split = [p for p in model.parameters() if isinstance(p, DTensor)]
    plain = [p for p in model.parameters() if not isinstance(p, DTensor)]
    groups = [{"params": g} for g in (split, plain) if g]
    return torch.optim.AdamW(groups, lr=1e-3, foreach=True)


def train_step(model, optimizer, ids, layout):
    import torch
    from torch.distributed.tensor.parallel import loss_parallel

    pos = torch.arange(ids.shape[1]).unsqueeze(0)
    if layout == "sp":
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        with loss_parallel():
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                     ids.flatten(0, 1))
            # torchtitan's train step frees the model's output before the backward ("del pred",
            # torchtitan/train.py, forward_backward_step); the loss keeps what it needs.
            del logits
            loss.backward()
    else:
        loss = model(input_ids=ids, labels=ids, position_ids=pos, use_cache=False).loss
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    loss = loss.detach()
    return float(loss.full_tensor() if hasattr(loss, "full_tensor") else loss)


def reference_loss(case, ids):
    """The same model and batch in one process, no TP: the loss the layout must reproduce."""
    import torch

    model = ms.build_model(case["config"], "none")
    with torch.no_grad():
        if case["layout"] == "sp":
            logits = model(input_ids=ids, use_cache=False).logits
            return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                           ids.flatten(0, 1)))
        return float(model(input_ids=ids, labels=ids, use_cache=False).loss)


def measure_case(mesh, case):
    from torch.distributed._tools.mem_tracker import MemTracker

    model = ms.build_model(case["config"], case["checkpointing"])
    params = ms.parameter_count(model)
    apply_tp(model, mesh, case["layout"])
    optimizer = make_optimizer(model)
    ids = ms.make_batch(case["config"], case["seq_len"], case["micro_batch"], 0)  # one TP group
    first_loss = train_step(model, optimizer, ids, case["layout"])
    gc.collect()

    class ProbedMemTracker(ms._PeakProbe, MemTracker):
        pass

    tracker = ProbedMemTracker()
    tracker.track_external(model, optimizer, ids)
    tracker._probe_init()
    with tracker:
        train_step(model, optimizer, ids, case["layout"])
    record = {
        "id": case_id(case),
        "layout": case["layout"],
        "tensor_parallel": TP,
        "sequence_parallel": case["layout"] == "sp",
        "world_size": TP,
        "config": case["config"],
        "params": params,
        "seq_len": case["seq_len"],
        "micro_batch": case["micro_batch"],
        "precision": "fp32",
        "checkpointing": case["checkpointing"],
        "optimizer": "adamw",
        **ms.read_tracker(tracker, ms.optimizer_state_bytes(optimizer)),
        "first_step_loss": round(first_loss, 5),
        "reference_loss": round(reference_loss(case, ids), 5),
    }
    del tracker, optimizer, model
    gc.collect()
    return record


def worker_main(out_path):
    import json

    import torch
    import transformers
    from torch.distributed.device_mesh import init_device_mesh

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (TP,))
    records, errors = [], []
    for case in case_grid():
        try:
            records.append(dict(measure_case(mesh, case), peak_bytes_samples=[]))
        except Exception as e:  # record it and go on
            errors.append({"id": case_id(case), "error": f"{type(e).__name__}: {e}"[:500]})
        torch.distributed.barrier()
    for r in records:
        r["peak_bytes_samples"] = [r["peak_bytes"]]
    with open(out_path, "w") as f:
        json.dump({"rank": torch.distributed.get_rank(), "records": records, "errors": errors}, f)
    torch.distributed.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/costmodel/data/oracle_tensor_parallel.json")
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_out:
        worker_main(args.worker_out.format(rank=os.environ.get("RANK", "0")))
        return 0
    started = time.time()
    with tempfile.TemporaryDirectory() as tmpdir:
        rc, files, log = ms.run_workers(os.path.abspath(__file__), TP,
                                        os.path.join(tmpdir, "tp"))
        if rc != 0 or not all(os.path.exists(p) for p in files):
            print(open(log).read()[-4000:])
            return 1
        cases, failures, warnings_ = ms.merge_ranks(files)
    command = " ".join(["python", GENERATED_BY, "--out", os.path.relpath(args.out)])
    ms.write_corpus(args.out, cases, failures, command, generated_by=GENERATED_BY,
                    configs={CONFIG: ms.CONFIGS[CONFIG]})
    return ms.report(args.out, cases, failures, warnings_, started)


if __name__ == "__main__":
    sys.exit(main())
