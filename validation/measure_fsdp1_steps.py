#!/usr/bin/env python3
"""Measure whole training steps under FSDP1 with Composer's mixed precision modes.

What it measures
    One training step of the Hugging Face models of measure_steps.py (``LlamaForCausalLM`` and
    ``GPT2LMHeadModel`` with 256-wide hidden states, float32 parameters, dropout 0, the model's own
    loss, ``torch.optim.AdamW(foreach=True)``), the second of two, on 2 gloo CPU ranks, each
    wrapped in ``torch.distributed.fsdp.FullyShardedDataParallel`` (FSDP1) as llm-foundry's
    Composer and accelerate wrap it: one FSDP unit per decoder layer (``ModuleWrapPolicy``) and the
    root holding the rest, ``ShardingStrategy.FULL_SHARD``, ``use_orig_params=True``, torch's
    defaults otherwise (``BackwardPrefetch.BACKWARD_PRE``, ``limit_all_gathers=True``).

    The grid: the two models x sequence 128/256 x micro-batch 1/2 x checkpointing none/full (HF's
    non-reentrant ``gradient_checkpointing_enable``) x precision:

    - "fp32": no ``MixedPrecision``, no autocast;
    - "bf16-mixed" under each of Composer's modes for ``fsdp_config.mixed_precision``
      (composer/distributed/mosaic_parallelism.py, get_mixed_precision, with precision amp_bf16),
      the forward and the loss under ``torch.autocast("cpu", dtype=torch.bfloat16)`` as Composer's
      precision context runs them:
        "default"  MixedPrecision(param_dtype=bf16, reduce_dtype=fp32, buffer_dtype=bf16)
        "pure"     MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16)
        "full"     MixedPrecision() (no dtype set: fp32 parameters gathered and reduced)

How it measures
    measure_steps.py's ``MemTracker`` probe (each category's own peak, where the total peaked). FSDP1
    frees and re-allocates its flat parameters by resizing their storages, which the tracker
    follows (it patches ``torch.UntypedStorage.resize_``). As for FSDP2, gloo's reduce-scatter
    clones its whole input, which NCCL does not: FSDP1 (torch 2.15, _runtime_utils.py, _reduce_grad)
    calls the same ``dist.reduce_scatter_single`` with an input and output made before the call,
    and fsdp2_on_gloo.gloo_copies_counted files what is first seen inside it apart from the peak.

Output
    A JSON corpus (``--out``) in measure_steps.py's format, ``wrapper`` "fsdp1", each case with its
    ``fsdp_mixed_precision`` (null for fp32). The planner predicts a case with
    ``planner estimate --strategy fsdp-full --flavour fsdp1 --recipe hf --fsdp-mixed-precision
    MODE`` (tests/planner/oracle_step_rows.cpp).

    python validation/measure_fsdp1_steps.py --out tests/costmodel/data/oracle_fsdp1_steps.json
"""

import argparse
import contextlib
import gc
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure_steps as steps  # noqa: E402
from fsdp2_on_gloo import gloo_copies_counted  # noqa: E402

GENERATED_BY = "validation/measure_fsdp1_steps.py"
CONFIGS = ("llama-h256", "gpt2-h256")
SEQ_LENS = (128, 256)
MICRO_BATCHES = (1, 2)
CHECKPOINTING = ("none", "full")
# (precision, Composer's mixed precision mode); fp32 has none.
PRECISIONS = (("fp32", None), ("bf16-mixed", "default"), ("bf16-mixed", "pure"),
              ("bf16-mixed", "full"))
WORLD_SIZE = 2
REPEATS = 2  # gloo's threads release buffers when they get to it: each case twice per rank


def case_grid():
    for config in CONFIGS:
        for precision, mode in PRECISIONS:
            for checkpointing in CHECKPOINTING:
                for seq_len in SEQ_LENS:
                    for micro_batch in MICRO_BATCHES:
                        yield {"config": config, "seq_len": seq_len, "micro_batch": micro_batch,
                               "precision": precision, "mode": mode,
                               "checkpointing": checkpointing}


def case_id(case):
    precision = case["precision"] + (f"-{case['mode']}" if case["mode"] else "")
    return (f"fsdp1/{case['config']}/{precision}/{case['checkpointing']}/"
            f"s{case['seq_len']}-b{case['micro_batch']}/w{WORLD_SIZE}")


def mixed_precision(mode):
    """Composer's get_mixed_precision for amp_bf16, by mode."""
    import torch
    from torch.distributed.fsdp import MixedPrecision

    bf16, fp32 = torch.bfloat16, torch.float32
    return {
        None: None,
        "default": MixedPrecision(param_dtype=bf16, reduce_dtype=fp32, buffer_dtype=bf16),
        "pure": MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16),
        "full": MixedPrecision(),
    }[mode]


def wrap_model(model, mode):
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    block = type(steps.decoder_layers(model)[0])
    # device_id: FSDP1 looks for an accelerator unless it is told the device.
    return FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({block}),
                                    sharding_strategy=ShardingStrategy.FULL_SHARD,
                                    mixed_precision=mixed_precision(mode), use_orig_params=True,
                                    device_id=torch.device("cpu"))


def train_step(model, optimizer, ids, precision):
    import torch

    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16-mixed"
                else contextlib.nullcontext())
    with autocast:
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def measure_case(rank, case):
    from torch.distributed._tools.mem_tracker import MemTracker

    model = steps.build_model(case["config"], case["checkpointing"])
    params = steps.parameter_count(model)
    model = wrap_model(model, case["mode"])
    optimizer = steps.make_optimizer(model)
    ids = steps.make_batch(case["config"], case["seq_len"], case["micro_batch"], rank)
    train_step(model, optimizer, ids, case["precision"])
    gc.collect()

    class ProbedMemTracker(steps._PeakProbe, MemTracker):
        # In forward and backward FSDP1 puts plain views of its flat parameter where the module's
        # parameters were, on which no gradient hook can be registered: the tracker's module
        # hooks count them without hooks, and it files the gradients by the ops that make them.
        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            return super()._track_module_params_and_buffers(module, install_grad_hooks=False)

    tracker = ProbedMemTracker()
    tracker.track_external(model, optimizer, ids)
    tracker._probe_init()
    with tracker, gloo_copies_counted(tracker):
        loss = train_step(model, optimizer, ids, case["precision"])
    record = {
        "id": case_id(case),
        "wrapper": "fsdp1",
        "world_size": WORLD_SIZE,
        "config": case["config"],
        "model_class": steps.CONFIGS[case["config"]]["architectures"][0],
        "params": params,
        "seq_len": case["seq_len"],
        "micro_batch": case["micro_batch"],
        "precision": case["precision"],
        "fsdp_mixed_precision": case["mode"],
        "attention": "flash",
        "loss": "upcast",
        "checkpointing": case["checkpointing"],
        "optimizer": "adamw",
        **steps.read_tracker(tracker, steps.optimizer_state_bytes(optimizer)),
        "loss_value": round(loss, 4),
    }
    del tracker, optimizer, model
    gc.collect()
    return record


def worker_main(out_path):
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    rank = int(os.environ.get("RANK", "0"))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    records, errors = [], []
    for case in case_grid():
        try:
            samples = [measure_case(rank, case) for _ in range(REPEATS)]
            records.append(dict(samples[0], peak_bytes_samples=[r["peak_bytes"] for r in samples]))
        except Exception as e:  # record it and go on with the other cases
            errors.append({"id": case_id(case),
                           "error": f"{type(e).__name__}: {e}".splitlines()[0][:500]})
            if len(errors) == 1:
                import traceback
                traceback.print_exc()
        torch.distributed.barrier()
    with open(out_path, "w") as f:
        json.dump({"rank": rank, "records": records, "errors": errors}, f)
    torch.distributed.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/costmodel/data/oracle_fsdp1_steps.json")
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_out:
        worker_main(args.worker_out.format(rank=os.environ.get("RANK", "0")))
        return 0
    started = time.time()
    with tempfile.TemporaryDirectory() as tmpdir:
        rc, files, log = steps.run_workers(os.path.abspath(__file__), WORLD_SIZE,
                                           os.path.join(tmpdir, "fsdp1-w2"))
        if rc != 0 or not all(os.path.exists(p) for p in files):
            with open(log) as f:
                print(f.read()[-4000:])
            return 1
        cases, failures, warnings_ = steps.merge_ranks(files)
    configs = {name: steps.CONFIGS[name] for name in CONFIGS}
    command = f"python {GENERATED_BY} --out {os.path.relpath(args.out)}"
    steps.write_corpus(args.out, cases, failures, command, generated_by=GENERATED_BY,
                       configs=configs)
    return steps.report(args.out, cases, failures, warnings_, started)


if __name__ == "__main__":
    sys.exit(main())
