# One schema: every function returns what `planner ... --format json` prints for the same options
# (both run planner/cli.cpp's code; the program is a separate process here, so the test fails if
# the module's argument building, documents or JSON conversion drift from the command line's).
import itertools
import json

import pytest

import shardplan
from conftest import ROOT, cli_json, cli_text, flags, without_timing

MODELS = ["gpt2-medium", "llama-2-7b", "mistral-7b"]
STRATEGIES = ["ddp", "zero1", "zero3", "fsdp-full", "fsdp-grad-op"]
HARDWARE = ["a100-sxm4-40gb", "h100-sxm5-80gb"]
GPUS = [8, 16]
JOB = dict(seq_len=2048, global_batch=64)


@pytest.mark.parametrize("model,strategy,hardware,gpus",
                         list(itertools.product(MODELS, STRATEGIES, HARDWARE, GPUS)))
def test_estimate_grid(model, strategy, hardware, gpus):
    options = dict(model=model, strategy=strategy, hardware=hardware, gpus=gpus, **JOB)
    assert shardplan.estimate(**options) == cli_json("estimate", *flags(**options), "--format", "json")


@pytest.mark.parametrize("model,hardware,gpus", list(itertools.product(MODELS, HARDWARE, GPUS)))
def test_recommend_grid(model, hardware, gpus):
    options = dict(model=model, hardware=hardware, gpus=gpus, **JOB)
    ours = shardplan.recommend(**options)
    theirs = cli_json("recommend", *flags(**options), "--format", "json")
    assert without_timing(ours) == without_timing(theirs)


def test_hsdp_offload_and_job_flags():
    options = dict(model="llama-2-13b", hardware="a100-sxm4-80gb", gpus=32, gpus_per_node=8,
                   strategy="hsdp", shard_group_size=8, offload="params", seq_len=4096,
                   global_batch=128, micro_batch=2, precision="bf16-mixed", optimizer="adamw",
                   checkpointing="full", recipe="torchtitan", headroom=0.1)
    assert shardplan.estimate(**options) == cli_json("estimate", *flags(**options), "--format", "json")


def test_defaults_are_the_cli_defaults():
    assert shardplan.estimate(strategy="zero3") == cli_json("estimate", "--strategy", "zero3", "--format", "json")


def test_compare_list_or_text():
    options = dict(model="llama-2-7b", gpus=8, seq_len=4096, global_batch=32)
    theirs = cli_json("compare", *flags(**options), "--strategy", "ddp,zero2,zero3,fsdp-full", "--format", "json")
    assert shardplan.compare(strategy=["ddp", "zero2", "zero3", "fsdp-full"], **options) == theirs
    assert shardplan.compare(strategy="ddp,zero2,zero3,fsdp-full", **options) == theirs
    assert shardplan.compare(**options) == cli_json("compare", *flags(**options), "--format", "json")


def test_simulate_writes_the_same_trace(tmp_path):
    options = dict(model="gpt2-large", gpus=8, strategy="zero3", seq_len=1024, global_batch=32)
    ours = shardplan.simulate(trace=tmp_path / "ours.json", **options)
    theirs = cli_json("simulate", *flags(**options), "--trace", str(tmp_path / "cli.json"), "--format", "json")
    assert ours == theirs
    assert json.loads((tmp_path / "ours.json").read_text()) == json.loads((tmp_path / "cli.json").read_text())


def test_estimate_of_a_deepspeed_config(tmp_path):
    config = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 3}}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    options = dict(model="llama-2-7b", gpus=16, seq_len=2048)
    assert shardplan.estimate(deepspeed=path, **options) == cli_json(
        "estimate", *flags(**options), "--deepspeed", str(path), "--format", "json")


def test_numbers_as_text_or_numbers():
    a = shardplan.estimate(params="7.5e9", gpus="64", global_batch="64", strategy="zero1", accounting="zero-paper")
    b = shardplan.estimate(params=7.5e9, gpus=64, global_batch=64, strategy="zero1", accounting="zero-paper")
    assert a == b == cli_json("estimate", "--params", "7.5e9", "--gpus", "64", "--global-batch", "64",
                              "--strategy", "zero1", "--accounting", "zero-paper", "--format", "json")


def test_svg_is_written(tmp_path):
    shardplan.recommend(model="gpt2", gpus=8, svg=tmp_path / "memory.svg")
    assert (tmp_path / "memory.svg").read_text().startswith("<svg")


def test_tensor_pipeline_and_context_parallel_plans():
    # A 3D plan through estimate and the model-parallel search through recommend.
    options = dict(model="llama-3-70b", hardware="h100-sxm5-80gb", gpus=256, seq_len=8192,
                   global_batch=64, strategy="fsdp-full", recipe="torchtitan", tensor_parallel=8,
                   sequence_parallel=True,
                   pipeline_parallel=4, schedule="interleaved-1f1b", virtual_stages=5,
                   micro_batches=8, micro_batch=1)
    assert shardplan.estimate(**options) == cli_json("estimate", *flags(**options), "--format", "json")
    search = dict(model="llama-3-70b", hardware="h100-sxm5-80gb", gpus=256, seq_len=8192,
                  global_batch=256, model_parallel=True)
    ours = shardplan.recommend(**search)
    theirs = cli_json("recommend", *flags(**search), "--format", "json")
    for r in (ours, theirs):
        del r["search_s"]  # the search's wall time
    assert ours == theirs


def test_float8_and_its_filter():
    # A filter given as a list is the comma-separated --float8-filter.
    options = dict(model="llama-3-8b", hardware="h100-sxm5-80gb", gpus=8, seq_len=4096,
                   global_batch=16, strategy="fsdp-full", recipe="torchtitan",
                   checkpointing="full", float8="rowwise")
    ours = shardplan.estimate(**options, float8_filter=["lm_head", "attention.wo"])
    theirs = cli_json("estimate", *flags(**options), "--float8-filter", "lm_head,attention.wo",
                      "--format", "json")
    assert ours == theirs
    assert ours["float8"] == "rowwise"
