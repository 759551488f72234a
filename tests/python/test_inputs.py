# Models and hardware given as names, paths, dicts and config objects; bad input as InputError.
import json
import math
from pathlib import Path

import pytest

import shardplan
from conftest import ROOT, cli_json

CONFIG = ROOT / "examples/models/llama-2-7b/config.json"
PROFILE = ROOT / "hardware_profiles/h100-sxm5-80gb.json"
JOB = dict(gpus=8, strategy="zero3", seq_len=2048, global_batch=32)


def without_names(estimate: dict) -> dict:
    """An estimate without the names of its model and hardware (a document in memory has no file
    name: it is named by its own "_name_or_path" or "name", else "model" or "hardware")."""
    e = json.loads(json.dumps(estimate))
    e["model"] = e["hardware"] = e["hardware_profile"]["name"] = None
    return e


def test_model_path_is_the_cli_path():
    assert shardplan.estimate(model=CONFIG, **JOB) == cli_json(
        "estimate", "--model", str(CONFIG), "--gpus", "8", "--strategy", "zero3", "--seq-len", "2048",
        "--global-batch", "32", "--format", "json")


def test_model_dict_plans_as_the_preset():
    config = json.loads(CONFIG.read_text())
    by_dict = shardplan.estimate(model=config, **JOB)
    by_name = shardplan.estimate(model="llama-2-7b", **JOB)
    assert without_names(by_dict) == without_names(by_name)


class FakePretrainedConfig:
    """What transformers' PretrainedConfig offers: to_diff_dict() (what save_pretrained writes) and
    to_dict() (every attribute, defaults included)."""

    def __init__(self, config: dict):
        self._config = config

    def to_diff_dict(self):
        return dict(self._config)

    def to_dict(self):
        return dict(self._config, output_hidden_states=False, use_return_dict=True)


class ToDictOnly:
    def __init__(self, config: dict):
        self._config = config

    def to_dict(self):
        return dict(self._config)


def test_config_objects_plan_as_the_preset():
    config = json.loads(CONFIG.read_text())
    by_name = without_names(shardplan.estimate(model="llama-2-7b", **JOB))
    assert without_names(shardplan.estimate(model=FakePretrainedConfig(config), **JOB)) == by_name
    assert without_names(shardplan.estimate(model=ToDictOnly(config), **JOB)) == by_name


def test_hardware_dict_plans_as_the_profile():
    profile = json.loads(PROFILE.read_text())
    by_dict = shardplan.estimate(hardware=profile, **JOB)
    by_name = shardplan.estimate(hardware="h100-sxm5-80gb", **JOB)
    assert without_names(by_dict) == without_names(by_name)
    assert shardplan.estimate(hardware=PROFILE, **JOB) == cli_json(
        "estimate", "--hardware", str(PROFILE), "--gpus", "8", "--strategy", "zero3", "--seq-len", "2048",
        "--global-batch", "32", "--format", "json")


def test_a_given_document_is_not_defaulted():
    config = json.loads(CONFIG.read_text())
    assert "defaulted" not in shardplan.estimate(model=config, hardware="a100-sxm4-80gb", **JOB)


def raises(field_prefix: str, value_text: str, **options):
    with pytest.raises(shardplan.InputError) as e:
        shardplan.estimate(**options)
    assert isinstance(e.value, ValueError)
    assert str(e.value).startswith(field_prefix + ":"), str(e.value)
    assert value_text in e.value.message, str(e.value)
    assert str(e.value) == f"{e.value.field}: {e.value.message}"
    return e.value


@pytest.mark.parametrize("field,value,options", [
    ("global_batch", "0", dict(JOB, global_batch=0)),
    ("gpus", "-8", dict(JOB, gpus=-8)),
    ("gpus", "eight", dict(JOB, gpus="eight")),
    ("seq_len", "1.5", dict(JOB, seq_len=1.5)),
    ("model", "no-such-model", dict(JOB, model="no-such-model")),
    ("hardware", "no-such-gpu", dict(JOB, hardware="no-such-gpu")),
    ("strategy", "zero9", dict(JOB, strategy="zero9")),
    ("precision", "fp8", dict(JOB, precision="fp8")),
    ("headroom", "2", dict(JOB, headroom=2)),
    ("gpu_memory_GiB", "-1", dict(JOB, gpu_memory_GiB=-1)),
    ("params", "not both", dict(JOB, params=7e9, model="llama-2-7b")),
    ("strategy", "missing", dict(gpus=8)),
])
def test_bad_options(field, value, options):
    raises(field, value, **options)


def test_bad_model_document_names_the_key():
    config = json.loads(CONFIG.read_text())
    config["hidden_size"] = -4096
    assert raises("model: /hidden_size", "-4096", model=config, **JOB).field == "model"
    config = json.loads(CONFIG.read_text())
    del config["num_hidden_layers"]
    raises("model: /num_hidden_layers", "missing", model=config, **JOB)


def test_bad_hardware_document_names_the_key():
    profile = json.loads(PROFILE.read_text())
    profile["schema_version"] = 7
    raises("hardware: /schema_version", "7", hardware=profile, **JOB)


def test_nan_in_a_document_is_refused():
    config = json.loads(CONFIG.read_text())
    config["hidden_size"] = math.nan
    raises("model", "JSON", model=config, **JOB)


def test_trace_into_a_missing_folder_is_refused(tmp_path):
    with pytest.raises(shardplan.InputError) as e:
        shardplan.simulate(trace=tmp_path / "no/such/folder/t.json", **JOB)
    assert e.value.field == "trace"


def test_wrong_types_and_names_are_type_errors():
    with pytest.raises(TypeError):
        shardplan.estimate(model=3.5, **JOB)
    with pytest.raises(TypeError):
        shardplan.estimate(global_bacth=8, **JOB)
    with pytest.raises(TypeError):
        shardplan.estimate(**dict(JOB, gpus=True))
    with pytest.raises(TypeError):
        shardplan.deepspeed_config(top=3, **JOB)


def test_no_plan_fits_is_an_input_error():
    with pytest.raises(shardplan.InputError) as e:
        shardplan.deepspeed_config(model="llama-2-70b", gpus=1, hardware="l40s-48gb")
    assert e.value.field == "emit"


def test_a_layout_refusal_names_its_flags_as_keywords():
    # transformers' Trainer runs no pipeline (documents/recipe.cpp): the layout's flags come back
    # as the keywords given, their values as they are.
    with pytest.raises(shardplan.InputError) as e:
        shardplan.estimate(model="llama-3-8b", gpus=8, global_batch=8, strategy="ddp", recipe="hf",
                           pipeline_parallel=2, micro_batches=2)
    assert e.value.field == "pipeline_parallel 2 micro_batches 2"
    assert e.value.message.startswith("the hf recipe's trainer runs no pipeline (asked for 2)")
