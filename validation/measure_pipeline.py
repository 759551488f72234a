#!/usr/bin/env python3
"""Measure the per-stage memory of pipeline-parallel training steps with PyTorch's own pipelining.

What it measures
    ``transformers.LlamaForCausalLM`` (the llama-h256 config of validation/measure_steps.py: 4
    blocks, float32, dropout 0, sdpa attention) split into p = 2 stages on 2 ranks (gloo, CPU) the
    way torchtitan's manual split does it (torchtitan/distributed/pipeline_parallel.py,
    pipeline_module_split: each stage a copy of the whole model with the other stages' parts
    deleted): stage 0 the token embedding and blocks 0-1, stage 1 blocks 2-3, the final norm and
    the head. Each stage is a ``torch.distributed.pipelining.PipelineStage`` run by
    ``ScheduleGPipe`` or ``Schedule1F1B`` with torchtitan's loss, ``cross_entropy(pred.flatten(0,
    1).float(), labels.flatten(0, 1))`` (torchtitan/components/loss.py), the schedule's default
    ``scale_grads=True`` (the accumulated gradients divided by the number of micro-batches), and
    ``return_outputs=False`` as torchtitan's train step passes it (the last stage keeps no merged
    output). Each rank steps its stage's parameters with ``torch.optim.AdamW(lr=1e-3,
    foreach=True)`` and ``zero_grad(set_to_none=True)``; no data parallelism (no DDP, no FSDP).

    With ScheduleInterleaved1F1B the model is split into p·v = 4 virtual stages of one block each
    (v = 2 model chunks per rank, as torchtitan's pipeline_module_split makes one module per
    virtual stage): rank r holds virtual stages r and r + 2 (torchtitan's "loop" style,
    stage_ids_this_rank), the first chunk of rank 0 with the embedding, the last of rank 1 with the
    final norm and the head; one optimizer per chunk (torchtitan's OptimizersContainer). torch
    requires m to be a multiple of its rounds, max(1, m // p) (schedules.py,
    ScheduleInterleaved1F1B.__init__): m = 2 and 4 both qualify.

    The grid: schedule gpipe/1f1b/interleaved-1f1b x micro-batches m 2/4 x seq 128/256 x
    checkpointing none/full
    (HF's non-reentrant gradient checkpointing of every block), micro-batch size 1 (the step's
    batch is m sequences, split by the schedule). The stage modules' forward is the HF model's
    own code path: the blocks called with the rotary position embeddings, no attention mask
    (sdpa's causal kernel), as ``LlamaModel.forward`` calls them.

How it measures
    As validation/measure_steps.py, on each rank: ``MemTracker`` over the second step (the
    schedule's step, then the optimizer step), after one warm-up step, with the stage module, the
    optimizer and the batch registered; storage bytes per category, the categories at the peak,
    each one's own peak, and the module and phase where the peak fell. MemTracker takes a root
    module's second forward for the next iteration and refuses it; the schedule runs the stage's
    module once per micro-batch, so a small subclass handles those calls as MemTracker handles a
    submodule called twice in one iteration (no byte count changes). The losses stay referenced
    through the optimizer step, as torchtitan's train step keeps its loss (torchtitan/train.py,
    train_step: the loss that forward_backward_step returns lives until after
    optimizers.step()); with them the graph's leaves, the last stage's received inputs. Every
    record also has the step's loss (the mean over the micro-batches, from the last stage) of
    both steps, and the losses of the same model and micro-batches in one process without a
    pipeline (gradient accumulation: each micro-batch's loss backward, the summed gradients
    divided by m, one optimizer step): they must agree.

    One correction, no other: MemTracker's module hooks keep every received input alive after the
    program lets it go. ``PipelineStage._retrieve_recv_activations``
    (torch/distributed/pipelining/stage.py) hands the stage's module the receive buffer itself,
    made a leaf that requires grad; ModTracker's ``_fw_pre_hook`` (MemTracker runs it for every
    module) calls ``register_multi_grad_hook`` (torch/autograd/graph.py) on the module's inputs,
    which captures such a leaf's AccumulateGrad node, itself holding the leaf, in a hook closure
    that the leaf holds: a reference cycle through C++ that gc does not collect, so the storage
    never dies and the tracker counts it to the end of the step. Without the tracker (checked
    with weak references to the received inputs over the same schedules), a stage that is not
    the last frees micro-batch k's received input when its ``backward_one_chunk`` for k returns:
    that pops k's entry of ``_forward_chunk_states`` (the input values and the stage output
    whose graph reaches the input), and nothing else of the stage keeps it. The last stage's
    received inputs rightly stay to the end of the measured step, since the losses (held through
    the optimizer step, above) keep their graphs, which end at the inputs' AccumulateGrad nodes.
    So, during the measured step, when a stage that is not the last returns from
    ``backward_one_chunk`` for micro-batch k and holds nothing more of k (no
    ``_forward_chunk_states`` entry, no ``backward_state`` of a split backward), the storage of
    k's received input is taken out of the count, as its deletion would take it; nothing runs
    between that return and the next op, so the peaks are those of the program without the
    tracker. Only ScheduleInterleaved1F1B's middle virtual stages (1 and 2) receive inputs and
    are not last; with GPipe and 1F1B (p = 2, one chunk per rank) only the last stage receives,
    and nothing is released. Every stage record's tracker_retained_inputs_released gives how
    many storages and bytes were taken out this way (interleaved: each rank's middle stage's m
    inputs, [1, seq, 256] float32 each; GPipe and 1F1B: none).

    For the interleaved cases each stage's record also has the rank's compute order as torch's
    schedule built it (op_order: "2B1" is virtual stage 2's backward of micro-batch 1), the
    virtual stages it holds and each chunk's parameter count.

Usage
    python validation/measure_pipeline.py --out tests/costmodel/data/oracle_pipeline.json
    (24 cases, 48 stage records: about a minute on two CPU cores)
"""

import argparse
import copy
import gc
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure_steps as ms  # noqa: E402  (the shared model, batch, tracker and corpus code)

GENERATED_BY = "validation/measure_pipeline.py"
CONFIG = "llama-h256"
PP = 2
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
# Model chunks per rank: ScheduleInterleaved1F1B runs v = 2 (4 virtual stages of one block each);
# the others one chunk per rank.
VIRTUAL_STAGES = {"gpipe": 1, "1f1b": 1, "interleaved-1f1b": 2}
MICRO_BATCH_COUNTS = (2, 4)
SEQ_LENS = (128, 256)
MICRO_BATCH = 1
CHECKPOINTING = ("none", "full")
LOSS_TOLERANCE = 1e-4  # relative, pipeline against gradient accumulation


def case_grid():
    for checkpointing in CHECKPOINTING:
        for schedule in SCHEDULES:
            for m in MICRO_BATCH_COUNTS:
                for seq_len in SEQ_LENS:
                    case = {"schedule": schedule, "config": CONFIG, "micro_batches": m,
                            "seq_len": seq_len, "micro_batch": MICRO_BATCH, "precision": "fp32",
                            "checkpointing": checkpointing}
                    if VIRTUAL_STAGES[schedule] > 1:
                        case["virtual_stages"] = VIRTUAL_STAGES[schedule]
                    yield case


def case_id(case):
    v = case.get("virtual_stages", 1)
    chunks = f"-v{v}" if v > 1 else ""
    return (f"pp{PP}-{case['schedule']}{chunks}-m{case['micro_batches']}/{case['config']}/fp32/"
            f"{case['checkpointing']}/s{case['seq_len']}-b{case['micro_batch']}")


def rank_stages(rank, v):
    """The virtual stages rank `rank` holds: torchtitan's "loop" style
    (torchtitan/distributed/pipeline_parallel.py, stage_ids_this_rank: rank + k·p, k < v)."""
    return [rank + k * PP for k in range(v)]


def stage_module(model, stage, stages):
    """The stage's module: a copy of the whole model less what other stages hold (torchtitan's
    pipeline_module_split deletes the other stages' blocks, the embedding off the first stage,
    the final norm and the head off the last)."""
    layers = len(model.model.layers)
    per_stage = layers // stages
    keep = range(stage * per_stage, (stage + 1) * per_stage)
    return llama_stage(copy.deepcopy(model), keep, stage == 0, stage == stages - 1)


def llama_stage(model, keep, first, last):
    """The blocks `keep` of an HF Llama, with its embedding (first) and its norm and head (last)."""
    import torch

    class _LlamaStage(torch.nn.Module):
        """Embedding (first stage), the kept blocks, final norm and head (last stage). The forward
        is LlamaModel.forward's: rotary embeddings from the position ids, each block called with
        them and no mask; the head's logits are the stage's output."""

        def __init__(self):
            super().__init__()
            base = model.model
            self.embed_tokens = base.embed_tokens if first else None
            self.layers = torch.nn.ModuleList(base.layers[i] for i in keep)
            self.rotary_emb = base.rotary_emb
            self.norm = base.norm if last else None
            self.lm_head = model.lm_head if last else None

        def forward(self, x):
            h = self.embed_tokens(x) if self.embed_tokens is not None else x
            pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
            pe = self.rotary_emb(h, pos)
            for layer in self.layers:
                h = layer(h, attention_mask=None, position_ids=pos, position_embeddings=pe)
            if self.lm_head is not None:
                h = self.lm_head(self.norm(h))
            return h

    return _LlamaStage()


def loss_fn(pred, labels):
    """torchtitan's cross-entropy (torchtitan/components/loss.py): the logits upcast to fp32."""
    import torch

    return torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def make_schedule(name, stages, m):
    """The schedule over the rank's stages: one for GPipe and 1F1B (PipelineScheduleSingle), the
    list of its chunks for ScheduleInterleaved1F1B (PipelineScheduleMulti), as torchtitan's
    build_pipeline_schedule passes them."""
    from torch.distributed.pipelining import (Schedule1F1B, ScheduleGPipe,
                                              ScheduleInterleaved1F1B)

    if name == "interleaved-1f1b":
        return ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=loss_fn,
                                       scale_grads=True)
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
    (stage,) = stages
    return cls(stage, n_microbatches=m, loss_fn=loss_fn, scale_grads=True)


def pipeline_step(schedule, stages, optimizers, ids):
    """One training step: the schedule's forward/backward over the micro-batches (torchtitan's
    train step arguments), each chunk's optimizer step and zero_grad in chunk order (torchtitan's
    OptimizersContainer: one optimizer per model part). Returns the mean loss (the rank holding
    the last stage) or None."""
    import torch

    first = any(s.is_first for s in stages)
    last = any(s.is_last for s in stages)
    losses = [] if last else None
    if first:
        schedule.step(ids, target=ids if last else None, losses=losses, return_outputs=False)
    else:
        schedule.step(target=ids if last else None, losses=losses, return_outputs=False)
    for optimizer in optimizers:
        optimizer.step()
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)
    return float(torch.stack([x.detach() for x in losses]).mean()) if losses else None


def reference_losses(case, ids, steps):
    """The whole model in one process over the same micro-batches: each micro-batch's loss
    backward (gradients summed), the gradients divided by m (the schedule's scale_grads), one
    AdamW step; the mean loss of each step."""
    import torch

    model = ms.build_model(case["config"], "none")
    whole = llama_stage(model, range(len(model.model.layers)), True, True)
    optimizer = ms.make_optimizer(whole)
    m = case["micro_batches"]
    out = []
    for _ in range(steps):
        losses = []
        for mb in ids.tensor_split(m, dim=0):
            loss = loss_fn(whole(mb), mb)
            loss.backward()
            losses.append(float(loss.detach()))
        for p in whole.parameters():
            if p.grad is not None:
                p.grad.div_(m)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        out.append(sum(losses) / m)
    return out


def make_tracker():
    """MemTracker that takes the stage module's forward once per micro-batch.

    MemTracker refuses a second forward of a root module (it takes it for the next iteration:
    mem_tracker.py, _pre_fw_hook, "multiple iterative calls"); the schedule calls the stage's
    module once per micro-batch in one step. Such a call is handled as MemTracker handles a
    submodule called again in one iteration (its case 3: the same stats, the new inputs, a new
    forward peak snapshot); storages are tracked as before, so no byte count changes. release()
    takes storages out of the count (release_received_inputs: the received inputs the tracker's
    own hooks keep alive), counted in ``released``."""
    from torch.distributed._tools.mem_tracker import MemTracker, _ModState, _UpdateType

    class MicroBatchMemTracker(ms._PeakProbe, MemTracker):
        def _pre_fw_hook(self, module, inputs):
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

        def _release_init(self):
            self.released = {"storages": 0, "bytes": 0}

        def release(self, tensors):
            """Takes the storages of `tensors` out of the count, as their deletion would."""
            for t in tensors:
                st = t.untyped_storage()
                winfo, _ = self._WINFO.get(st, (None, None))
                if winfo is None:
                    continue
                if winfo.mem_consumed > 0:
                    self._update_snap(_UpdateType.DEL, winfo)
                del self._WINFO[st]
                self.released["storages"] += 1
                self.released["bytes"] += winfo.mem_consumed

    tracker = MicroBatchMemTracker()
    tracker._release_init()
    return tracker


def release_received_inputs(tracker, stages):
    """Stops counting each received input of a stage that is not the last once the stage's
    backward of that micro-batch has returned (see "How it measures": the tracker's hooks keep
    the input alive, the program does not). Wraps the stages' ``_retrieve_recv_activations`` and
    ``backward_one_chunk`` (instance attributes, over torch's methods); returns a function that
    removes the wrappers."""
    import weakref

    import torch

    wrapped = []
    for stage in stages:
        if stage.is_last:
            continue
        received = {}  # micro-batch -> weak references to its received inputs
        retrieve, backward = stage._retrieve_recv_activations, stage.backward_one_chunk

        def retrieve_recv(fwd_chunk_id, *args, _retrieve=retrieve, _received=received, **kwargs):
            activations = _retrieve(fwd_chunk_id, *args, **kwargs)
            _received[fwd_chunk_id] = [weakref.ref(a) for a in activations
                                       if isinstance(a, torch.Tensor) and a.requires_grad]
            return activations

        def backward_chunk(bwd_chunk_id, *args, _stage=stage, _backward=backward,
                           _received=received, **kwargs):
            out = _backward(bwd_chunk_id, *args, **kwargs)
            if (bwd_chunk_id not in _stage._forward_chunk_states and
                    bwd_chunk_id not in getattr(_stage, "backward_state", {})):
                refs = _received.pop(bwd_chunk_id, [])
                tracker.release([t for t in (r() for r in refs) if t is not None])
            return out

        stage._retrieve_recv_activations = retrieve_recv
        stage.backward_one_chunk = backward_chunk
        wrapped.append(stage)

    def restore():
        for stage in wrapped:
            del stage._retrieve_recv_activations, stage.backward_one_chunk

    return restore


def measure_case(rank, case):
    import torch
    from torch.distributed.pipelining import PipelineStage

    v = case.get("virtual_stages", 1)
    model = ms.build_model(case["config"], case["checkpointing"])
    params = ms.parameter_count(model)
    held = rank_stages(rank, v)
    modules = [stage_module(model, k, PP * v) for k in held]
    del model
    stage_params = sum(p.numel() for module in modules for p in module.parameters())
    stages = [PipelineStage(module, k, PP * v, torch.device("cpu"))
              for module, k in zip(modules, held)]
    schedule = make_schedule(case["schedule"], stages, case["micro_batches"])
    optimizers = [ms.make_optimizer(module) for module in modules]
    ids = ms.make_batch(case["config"], case["seq_len"], case["micro_batch"] *
                        case["micro_batches"], 0)  # one pipeline: every rank the same batch
    first_loss = pipeline_step(schedule, stages, optimizers, ids)
    gc.collect()

    tracker = make_tracker()
    tracker.track_external(*modules, *optimizers, ids)
    tracker._probe_init()
    restore = release_received_inputs(tracker, stages)
    try:
        with tracker:
            second_loss = pipeline_step(schedule, stages, optimizers, ids)
    finally:
        restore()
    last = any(s.is_last for s in stages)
    record = {
        "stage": rank,
        "blocks": sum(len(module.layers) for module in modules),
        "first": any(s.is_first for s in stages),
        "last": last,
        "params": params,
        "stage_params": stage_params,
        **ms.read_tracker(tracker, sum(ms.optimizer_state_bytes(o) for o in optimizers)),
        "tracker_retained_inputs_released": dict(tracker.released),
    }
    if v > 1:
        # torch's compute order for this rank (schedules.py: pipeline_order, before the
        # communication actions are added), each action as torch prints it: virtual stage, F or B,
        # micro-batch ("2B1").
        record["op_order"] = [str(a) for a in schedule.pipeline_order[rank] if a is not None]
        record["virtual_stages_held"] = held
        record["chunk_params"] = [sum(p.numel() for p in module.parameters())
                                  for module in modules]
    if last:
        ref = reference_losses(case, ids, 2)
        record["step_losses"] = [round(first_loss, 5), round(second_loss, 5)]
        record["reference_losses"] = [round(x, 5) for x in ref]
        record["losses_agree"] = all(
            abs(a - b) <= LOSS_TOLERANCE * abs(b) for a, b in zip((first_loss, second_loss), ref))
    del tracker, optimizers, schedule, stages, modules
    gc.collect()
    return record


def worker_main(out_path):
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    records, errors = [], []
    for case in case_grid():
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


def merge_stages(files):
    """One case per grid point, its stages' records in stage order; a case any rank failed, or
    whose losses disagree with gradient accumulation, is a failure."""
    results = []
    for path in files:
        with open(path) as f:
            results.append(json.load(f))
    by_rank = [{r["id"]: r for r in res["records"]} for res in results]
    failures = {e["id"]: e["error"] for res in results for e in res["errors"]}
    cases = []
    for case in case_grid():
        cid = case_id(case)
        if cid in failures:
            continue
        stages = [ranks[cid] for ranks in by_rank]
        for s in stages:
            s.pop("id")
        last = stages[-1]
        record = {"id": cid, "pipeline_parallel": PP, "world_size": PP, **case,
                  "optimizer": "adamw", "params": last.pop("params"),
                  "step_losses": last.pop("step_losses"),
                  "reference_losses": last.pop("reference_losses"),
                  "losses_agree": last.pop("losses_agree")}
        for s in stages:
            s.pop("params", None)
        record["stages"] = stages
        if not record["losses_agree"]:
            failures[cid] = (f"pipeline losses {record['step_losses']} differ from gradient "
                             f"accumulation's {record['reference_losses']}")
        cases.append(record)
    return cases, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/costmodel/data/oracle_pipeline.json")
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_out:
        worker_main(args.worker_out.format(rank=os.environ.get("RANK", "0")))
        return 0
    started = time.time()
    with tempfile.TemporaryDirectory() as tmpdir:
        rc, files, log = ms.run_workers(os.path.abspath(__file__), PP,
                                        os.path.join(tmpdir, "pp"))
        if rc != 0 or not all(os.path.exists(p) for p in files):
            print(open(log).read()[-4000:])
            return 1
        cases, failures = merge_stages(files)
    out = os.path.relpath(args.out)
    command = " ".join(["python", GENERATED_BY, "--out",
                        out if not out.startswith("..") else os.path.basename(out)])
    ms.write_corpus(args.out, cases, failures, command, generated_by=GENERATED_BY,
                    configs={CONFIG: ms.CONFIGS[CONFIG]})
    return ms.report(args.out, cases, failures, [], started)


if __name__ == "__main__":
    sys.exit(main())
