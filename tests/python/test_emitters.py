# The emitters as Python objects: the same documents as `planner recommend --emit ...`, and the
# FSDP2 / torchtitan settings as data matching the text the command line prints.
import pytest

import shardplan
from conftest import cli_json, cli_text, flags

JOB = dict(model="llama-2-7b", hardware="a100-sxm4-80gb", gpus=16, seq_len=4096, global_batch=64)


def test_deepspeed_config_is_the_cli_document():
    assert shardplan.deepspeed_config(**JOB) == cli_json("recommend", *flags(**JOB), "--emit", "deepspeed")


def test_plan_document_is_the_cli_document():
    options = dict(JOB, strategy="zero3")
    assert shardplan.plan_document(**options) == cli_json("recommend", *flags(**options), "--emit", "plan")


def test_fsdp_settings_text_is_the_cli_text():
    settings = shardplan.fsdp_settings(**JOB)
    assert settings["text"] == cli_text("recommend", *flags(**JOB), "--emit", "fsdp")
    assert settings["flavour"] in ("ddp", "fsdp1", "fsdp2")


def test_llm_foundry_yaml_is_the_cli_text():
    options = dict(JOB, recipe="llm-foundry", fsdp_mixed_precision="full")
    text = shardplan.llm_foundry_yaml(**options)
    assert text == cli_text("recommend", *flags(**options), "--emit", "llm-foundry")
    assert '  mixed_precision: "FULL"' in text


def test_fsdp2_full_shard_in_bf16_mixed():
    # FSDP2's MixedPrecisionPolicy (torch/distributed/fsdp/_fully_shard/_fsdp_api.py): bf16-mixed
    # computes in bf16; reduce_dtype left unset reduces in param_dtype, so the hf recipe's plan
    # reduces in bf16. FULL_SHARD frees the gathered parameters after forward.
    args = shardplan.fsdp2_args(**JOB, strategy="fsdp-full", precision="bf16-mixed")
    assert args["mp_policy"] == {"param_dtype": "bfloat16", "reduce_dtype": "bfloat16"}
    assert args["reshard_after_forward"] is True
    assert args["mesh"] == {"shape": [16], "mesh_dim_names": ["dp_shard"]}
    assert args["offload_policy"] == {"type": "OffloadPolicy"}
    assert args["model_dtype"] is None


def test_fsdp2_grad_op_keeps_parameters_and_torchtitan_reduces_in_fp32():
    # SHARD_GRAD_OP keeps the gathered parameters from forward to backward
    # (reshard_after_forward=False); torchtitan's mixed_precision_reduce is "float32" only
    # (torchtitan/config/job_config.py), so its recipe reduces in fp32.
    args = shardplan.fsdp2_args(**JOB, strategy="fsdp-grad-op", recipe="torchtitan")
    assert args["reshard_after_forward"] is False
    assert args["mp_policy"]["reduce_dtype"] == "float32"


def test_hsdp_mesh_replicates_across_groups():
    # 16 GPUs in shard groups of 8: 2 replicas of an 8-way shard, dim 0 replicating
    # (fully_shard on a 2-D mesh is HSDP).
    args = shardplan.fsdp2_args(**JOB, strategy="hsdp", shard_group_size=8)
    assert args["mesh"] == {"shape": [2, 8], "mesh_dim_names": ["dp_replicate", "dp_shard"]}


def test_offload_params_is_cpu_offload_policy():
    args = shardplan.fsdp2_args(**JOB, strategy="fsdp-full", offload="params")
    assert args["offload_policy"] == {"type": "CPUOffloadPolicy", "pin_memory": True}


def test_pure_bf16_casts_the_model():
    assert shardplan.fsdp2_args(**JOB, strategy="fsdp-full", precision="bf16")["model_dtype"] == "bfloat16"


def test_torchtitan_0_3_options_are_its_command_line():
    options = dict(JOB, strategy="fsdp-full", micro_batch=2, checkpointing="full")
    titan = shardplan.torchtitan_options(**options)  # torchtitan 0.3.0's, by default
    args = titan["args"]
    assert args[args.index("--training.local_batch_size") + 1] == "2"
    assert args[args.index("--parallelism.data_parallel_shard_degree") + 1] == "16"
    assert args[-1] == "activation_checkpoint:full"
    # The words are the command line's, in its order.
    text = cli_text("recommend", *flags(**options), "--emit", "fsdp")
    line = text[text.index("-m torchtitan.train"):]
    assert " ".join(args) in " ".join(line.replace("\\\n", " ").split())
    with pytest.raises(shardplan.InputError) as e:
        shardplan.torchtitan_options(version="0.1", **options)
    assert e.value.field == "version"


def test_torchtitan_options_match_the_plan():
    options = dict(JOB, strategy="fsdp-full", micro_batch=2, checkpointing="full")
    titan = shardplan.torchtitan_options(version="0.2", **options)
    # local batch = the micro-batch; the whole batch and sequence as given; 16 GPUs all sharding.
    assert titan["training"]["local_batch_size"] == 2
    assert titan["training"]["global_batch_size"] == 64
    assert titan["training"]["seq_len"] == 4096
    assert titan["parallelism"]["data_parallel_shard_degree"] == 16
    assert titan["parallelism"]["data_parallel_replicate_degree"] == 1
    assert titan["parallelism"]["fsdp_reshard_after_forward"] == "default"
    assert titan["activation_checkpoint"] == {"mode": "full"}
    # Every value is the one in the TOML the command line prints.
    text = cli_text("recommend", *flags(**options), "--emit", "fsdp")
    assert 'local_batch_size = 2\n' in text and 'mode = "full"\n' in text


def test_every_nth_block_is_selective_ac_option_text():
    titan = shardplan.torchtitan_options(version="0.2", **JOB, strategy="fsdp-full",
                                         checkpointing="every:2")
    assert titan["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "2"}


def test_fsdp2_args_of_a_zero_strategy_is_refused():
    with pytest.raises(shardplan.InputError) as e:
        shardplan.fsdp2_args(**JOB, strategy="zero3")
    assert e.value.field == "strategy" and "zero3" in e.value.message


def test_fsdp2_args_of_another_flavour_is_refused():
    with pytest.raises(shardplan.InputError) as e:
        shardplan.fsdp2_args(**JOB, flavour="fsdp1")
    assert e.value.field == "flavour" and "fsdp1" in e.value.message


def test_no_torchtitan_options_for_a_mixture_of_experts():
    # torchtitan trains its own MoE code, not the transformers block the plan counts.
    job = dict(model="mixtral-8x7b", hardware="h100-sxm5-80gb", gpus=16, seq_len=4096,
               global_batch=64, strategy="fsdp-full", checkpointing="full")
    with pytest.raises(shardplan.InputError) as e:
        shardplan.torchtitan_options(**job)
    assert e.value.field == "model"
    assert shardplan.fsdp2_args(**job)  # the fully_shard arguments are written
