#!/usr/bin/env python3
"""The YAML `planner recommend --emit llm-foundry` writes, read by llm-foundry's and Composer's code.

For each case the emitted keys are merged (omegaconf) over a train YAML that names placeholders for
what a plan does not set (tokenizer, optimizer, scheduler, train_loader, max_duration), as
scripts/train/train.py merges a YAML, and handed to llm-foundry's own make_dataclass_and_log_config
with its update_batch_size_info over the plan's world (Composer's dist reads WORLD_SIZE before the
process group exists): TrainConfig must hold the plan's batch (device_train_batch_size,
device_train_microbatch_size, device_train_grad_accum), sequence and precision. fsdp_config must
build Composer's FSDPConfig (which refuses a key it does not know) with every value as written, and
Composer's get_mixed_precision must give the dtypes the plan was costed with. An MPT model section
must build llm-foundry's MPTConfig (its own validation) with the attention the plan ran.

Usage: llm_foundry_config_parse.py PLANNER   (exit 77, "skipped", where llm-foundry does not
import: point ctest at an interpreter that has it with SHARDPLAN_LLM_FOUNDRY_PYTHON). Checked with
llm-foundry 0.22.0 from PyPI (validation/requirements-llm-foundry.txt).
"""
import json
import os
import subprocess
import sys
import tempfile

SKIPPED = 77
try:
    import torch
    from composer.distributed.mosaic_parallelism import get_mixed_precision
    from composer.utils import FSDPConfig
    from llmfoundry.models.mpt import configuration_mpt
    from llmfoundry.models.mpt.configuration_mpt import MPTConfig
    from llmfoundry.utils.config_utils import (TRAIN_CONFIG_KEYS, TrainConfig,
                                               make_dataclass_and_log_config,
                                               update_batch_size_info)
    from omegaconf import OmegaConf as om
except Exception as e:  # not installed, or an install that cannot import
    print(f"SKIP: llm-foundry does not import with {sys.executable} ({e.__class__.__name__}: {e}); "
          "install llm-foundry to check the emitted YAML")
    sys.exit(SKIPPED)

# An MPT-7B-shaped config.json as llm-foundry exports it (ALiBi, no biases, flash attention).
MPT = {"architectures": ["MPTForCausalLM"], "model_type": "mpt", "d_model": 4096, "n_heads": 32,
       "n_layers": 32, "expansion_ratio": 4, "max_seq_len": 2048, "vocab_size": 50368,
       "no_bias": True, "attn_config": {"attn_impl": "flash", "alibi": True}}
BASE = ["recommend", "--recipe", "llm-foundry", "--hardware", "h100-sxm5-80gb", "--emit",
        "llm-foundry"]
F32, BF16 = torch.float32, torch.bfloat16
# (model, GPUs, flags, the (param, reduce) dtypes Composer must set, where None is fp32 left unset)
CASES = [
    ("mpt", 8, ["--seq-len", "2048", "--global-batch", "48", "--fsdp-mixed-precision", "default"],
     (BF16, F32)),
    ("mpt", 8, ["--seq-len", "2048", "--global-batch", "64", "--fsdp-mixed-precision", "full",
                "--checkpointing", "full", "--micro-batch", "2"], (None, None)),
    ("mpt", 16, ["--seq-len", "2048", "--global-batch", "64", "--strategy", "hsdp",
                 "--fsdp-mixed-precision", "pure", "--loss", "upcast", "--gpus-per-node", "8"],
     (BF16, BF16)),
    ("llama-2-7b", 8, ["--seq-len", "4096", "--global-batch", "32", "--strategy", "fsdp-grad-op",
                       "--precision", "fp32", "--checkpointing", "full"], (None, None)),
]


def emitted(planner, model, gpus, flags):
    out = subprocess.run([planner, *BASE, "--model", model, "--gpus", str(gpus), *flags],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"planner {' '.join(flags)}: exit {out.returncode}: {out.stderr}")
    return out.stdout


def train_config(text, gpus):
    """TrainConfig as train.py builds it from a YAML carrying the emitted keys."""
    base = om.create({
        "tokenizer": {"name": "placeholder"},
        "optimizer": {"name": "decoupled_adamw", "lr": 1e-4},
        "scheduler": {"name": "constant_with_warmup", "t_warmup": "0ba"},
        "train_loader": {"name": "text", "dataset": {}},
        "max_duration": "1ba",
        "model": {"name": "hf_causal_lm", "pretrained_model_name_or_path": "placeholder"},
    })
    cfg = om.merge(base, om.create(text))
    os.environ["WORLD_SIZE"] = str(gpus)
    _, train = make_dataclass_and_log_config(cfg, TrainConfig, TRAIN_CONFIG_KEYS,
                                             transforms=[update_batch_size_info])
    return om.to_container(om.create(text)), train


def check(planner, model_file, case):
    model, gpus, flags, (param, reduce) = case
    name = model_file if model == "mpt" else model
    text = emitted(planner, name, gpus, flags)
    want, train = train_config(text, gpus)
    problems = []

    def expect(what, got, expected):
        if got != expected:
            problems.append(f"{what}: llm-foundry reads {got!r}, the plan says {expected!r}")

    mb = want["device_train_microbatch_size"]
    expect("device_train_batch_size", train.device_train_batch_size,
           want["global_train_batch_size"] // gpus)
    expect("device_train_microbatch_size", train.device_train_microbatch_size, mb)
    expect("device_train_grad_accum", train.device_train_grad_accum,
           want["global_train_batch_size"] // gpus // mb)
    expect("max_seq_len", train.max_seq_len, want["max_seq_len"])
    expect("precision", train.precision, want["precision"])
    fsdp = FSDPConfig(**train.fsdp_config)
    for key, value in want["fsdp_config"].items():
        expect(f"fsdp_config.{key}", getattr(fsdp, key), value)
    mp, param_dtype, reduce_dtype, _ = get_mixed_precision(train.precision, fsdp.mixed_precision)
    expect("param_dtype", param_dtype, param)
    expect("reduce_dtype", reduce_dtype, reduce)
    if model == "mpt":
        # MPTConfig asks whether flash-attn 2.4.2+ is installed for ALiBi under flash attention:
        # the GPU job's environment has it; this CPU has none, so it stands as installed.
        configuration_mpt.check_alibi_support = lambda impl: impl in ("torch", "flash")
        section = dict(train.model)
        expect("model.name", section.pop("name"), "mpt_causal_lm")
        expect("model.loss_fn", section.pop("loss_fn"),
               "torch_crossentropy" if "upcast" in flags else "fused_crossentropy")
        config = MPTConfig(**section)
        expect("model.attn_config.attn_impl", config.attn_config["attn_impl"], "flash")
        expect("model.d_model", config.d_model, MPT["d_model"])
    return problems


def main():
    planner = sys.argv[1]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        model_file = os.path.join(tmp, "mpt-7b.json")
        with open(model_file, "w") as f:
            json.dump(MPT, f)
        for case in CASES:
            problems = check(planner, model_file, case)
            label = f"{case[0]} on {case[1]} GPUs {' '.join(case[2])}"
            print(("FAIL " if problems else "ok   ") + label)
            for p in problems:
                print("     " + p)
            failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
