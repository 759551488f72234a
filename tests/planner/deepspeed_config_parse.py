#!/usr/bin/env python3
"""The DeepSpeed configs `planner recommend --emit deepspeed` writes, read by DeepSpeed's own parser.

For each case the emitted JSON is handed to deepspeed.runtime.config.DeepSpeedConfig as
deepspeed.initialize would hand it, with the plan's data-parallel world (an mpu answering the
plan's GPU count; one gloo process stands for the job, so the parser's batch arithmetic runs
against the world the plan was made for). Every value the planner wrote must come out of the
parser as written: the batch sizes and accumulation, the precision, the communication dtype, the
clipping and each key of zero_optimization (by DeepSpeed's own field names and aliases, offload
sections included). A key DeepSpeed does not know, a value it refuses or reads differently fails.

Usage: deepspeed_config_parse.py PLANNER   (exit 77, "skipped", where DeepSpeed does not import:
point ctest at an interpreter that has it with SHARDPLAN_DEEPSPEED_PYTHON). Checked with
DeepSpeed 0.19.8 from PyPI (validation/requirements.txt).
"""
import importlib
import json
import os
import subprocess
import sys

SKIPPED = 77
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("SHARDPLAN_DS_PORT", "29533"),
                  RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", DS_ACCELERATOR="cpu")
try:
    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig
except Exception as e:  # not installed, or an install that cannot import
    print(f"SKIP: DeepSpeed does not import with {sys.executable} ({e.__class__.__name__}: {e}); "
          "install deepspeed to check the emitted configs")
    sys.exit(SKIPPED)

BASE = ["recommend", "--model", "gpt2", "--hardware", "a100-sxm4-80gb", "--seq-len", "1024",
        "--emit", "deepspeed"]
# (GPUs, the rest of the flags): each ZeRO stage, offload of the optimizer and of the parameters,
# fp16 with loss scaling and fp32, a reduce dtype, checkpointing.
CASES = [
    (8, ["--global-batch", "64", "--strategy", "zero1"]),
    (8, ["--global-batch", "256", "--strategy", "zero2", "--micro-batch", "4"]),
    (16, ["--global-batch", "64", "--strategy", "zero3", "--checkpointing", "full"]),
    (8, ["--global-batch", "64", "--strategy", "zero3", "--offload", "params"]),
    (8, ["--global-batch", "64", "--strategy", "zero2", "--offload", "optimizer"]),
    (8, ["--global-batch", "64", "--strategy", "zero2", "--precision", "fp16-mixed"]),
    (4, ["--global-batch", "32", "--strategy", "zero1", "--precision", "fp32"]),
    (8, ["--global-batch", "64", "--strategy", "zero3", "--reduce-dtype", "fp32"]),
]


class DataParallel:
    """The mpu DeepSpeedConfig asks for the data-parallel world size."""

    def __init__(self, ranks):
        self.ranks = ranks

    def get_data_parallel_world_size(self):
        return self.ranks


def emitted(planner, gpus, flags):
    out = subprocess.run([planner, *BASE, "--gpus", str(gpus), *flags], capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise RuntimeError(f"planner {' '.join(flags)} exited {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def same(a, b):
    return a == b or (isinstance(a, float) or isinstance(b, float)) and float(a) == float(b)


def check(planner, gpus, flags):
    """The differences between what the planner wrote and what DeepSpeed read ([] when none)."""
    cfg = emitted(planner, gpus, flags)
    parsed = DeepSpeedConfig(cfg, mpu=DataParallel(gpus))
    bad = []

    def expect(what, want, got):
        if not same(want, got):
            bad.append(f"{what}: wrote {want!r}, DeepSpeed read {got!r}")

    expect("train_batch_size", cfg["train_batch_size"], parsed.train_batch_size)
    expect("train_micro_batch_size_per_gpu", cfg["train_micro_batch_size_per_gpu"],
           parsed.train_micro_batch_size_per_gpu)
    expect("gradient_accumulation_steps", cfg["gradient_accumulation_steps"],
           parsed.gradient_accumulation_steps)
    expect("bf16.enabled", cfg["bf16"]["enabled"], parsed.bfloat16_config.enabled)
    expect("fp16.enabled", cfg["fp16"]["enabled"], parsed.float16_config.enabled)
    if "gradient_clipping" in cfg:
        expect("gradient_clipping", cfg["gradient_clipping"], parsed.gradient_clipping)
    if "communication_data_type" in cfg:
        names = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16"}
        expect("communication_data_type", names.get(cfg["communication_data_type"]),
               str(parsed.communication_data_type))
    zero = parsed.zero_config.model_dump(by_alias=True)
    for key, want in cfg["zero_optimization"].items():
        got = zero.get(key)
        if isinstance(want, dict):  # offload_optimizer, offload_param: each key as written
            for k, v in want.items():
                expect(f"zero_optimization.{key}.{k}", v, (got or {}).get(k))
        else:
            expect(f"zero_optimization.{key}", want, got)
    return bad


def main():
    planner = sys.argv[1]
    # DeepSpeed's torch backend builds its CPU shared-memory all-reduce kernel (a C++ extension,
    # compiled on first use: about 50 s on a machine without torch's extension cache) when it
    # starts; the configs' parser never calls a collective, so this process starts without it.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    failures = []
    for gpus, flags in CASES:
        what = f"--gpus {gpus} {' '.join(flags)}"
        try:
            bad = check(planner, gpus, flags)
        except Exception as e:  # DeepSpeed refused the config, or the planner did not emit one
            bad = [f"{e.__class__.__name__}: {e}"]
        failures += [f"{what}: {b}" for b in bad]
        print(f"{what}: {'ok' if not bad else f'{len(bad)} difference(s)'}")
    for f in failures:
        print(f"FAIL {f}")
    print(f"DeepSpeed {deepspeed.__version__}: {len(CASES)} emitted configs parsed, {len(failures)} "
          "failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
