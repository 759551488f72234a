"""shardplan from Python: the planner's subcommands as functions returning what the command line
prints with ``--format json`` (the same C++ code builds both), and its emitters as Python objects.

    import shardplan
    best = shardplan.recommend(model="llama-2-13b", hardware="a100-sxm4-40gb", gpus=16,
                               seq_len=4096, global_batch=64)
    print(best["recommendation"]["strategy"])

Options are the command line's flags with underscores (``--global-batch`` is ``global_batch``).
Numbers may be given as numbers or as text; what is left out is defaulted as on the command line.
A model is a preset name, a path to a config.json (or its folder), a dict of a config.json, or a
``transformers`` config object (anything with ``to_diff_dict()`` or ``to_dict()``; transformers is
not imported). Hardware is a profile name, a profile file's path, or a dict of a profile.
Bad input raises :class:`InputError` (a ``ValueError``) naming the option and the value.
The functions release the GIL while they plan and may be called from several threads at once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = [
    "InputError",
    "estimate",
    "simulate",
    "recommend",
    "compare",
    "deepspeed_config",
    "fsdp2_args",
    "torchtitan_options",
    "fsdp_settings",
    "plan_document",
    "llm_foundry_yaml",
]

# An installed wheel carries the hardware profiles and model presets in shardplan/data; the C++
# side reads $SHARDPLAN_DATA_DIR (documents::data_dir). From a build tree the source tree's are used.
_DATA = Path(__file__).resolve().parent / "data"
if _DATA.is_dir() and "SHARDPLAN_DATA_DIR" not in os.environ:
    os.environ["SHARDPLAN_DATA_DIR"] = str(_DATA)


class InputError(ValueError):
    """Bad input. ``field`` names the keyword argument (``global_batch``) or the place in a
    document (``model: /hidden_size``); ``message`` says what is wrong and quotes the value."""

    def __init__(self, where: str, message: str) -> None:
        self.field = _field_name(where)
        self.message = message
        super().__init__(f"{self.field}: {message}")

    def __reduce__(self):  # pickles (a ProcessPoolExecutor sends it back) with its two fields
        return (_input_error, (self.field, self.message))


def _input_error(field: str, message: str) -> InputError:
    return InputError(field, message)


from . import _shardplan  # noqa: E402  (after InputError: the module raises it by name)

__version__: str = _shardplan.__version__  # the project's version (CMakeLists.txt)

Model = Union[str, "os.PathLike[str]", Mapping[str, Any], Any]
Hardware = Union[str, "os.PathLike[str]", Mapping[str, Any]]
Number = Union[int, float, str]


def _field_name(where: str) -> str:
    """"--global-batch" -> "global_batch", "--tensor-parallel 8 --sequence-parallel" ->
    "tensor_parallel 8 sequence_parallel" (the flags as keywords, their values as given); anything
    else (a JSON pointer, a file) unchanged."""
    if where.startswith("--"):
        return " ".join(w[2:].replace("-", "_") if w.startswith("--") else w
                        for w in where.split(" "))
    return where


# The flags that take no value.
_SWITCHES = ("exhaustive", "sequence_parallel", "async_tensor_parallel", "model_parallel",
             "data_parallel_only", "compile")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _text(name: str, value: Any) -> str:
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected a number or text, got {value!r}")
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, float):
        return repr(value)  # shortest text that reads back as the same double
    if isinstance(value, (list, tuple)):  # a LIST option: its items, comma-separated
        return ",".join(_text(name, v) for v in value)
    return str(value)


def _document(name: str, value: Any) -> str:
    """A dict (or a config object) as JSON text for the C++ reader."""
    if not isinstance(value, Mapping):
        # transformers' PretrainedConfig: to_diff_dict() is what save_pretrained writes to
        # config.json; to_dict() adds every default (their keys are read or ignored alike).
        for method in ("to_diff_dict", "to_dict"):
            if callable(getattr(value, method, None)):
                value = getattr(value, method)()
                break
        else:
            raise TypeError(
                f"{name}: expected a name, a path, a dict or an object with to_dict(), "
                f"got {type(value).__name__}"
            )
    try:
        return json.dumps(dict(value), default=str, allow_nan=False)
    except ValueError as e:  # nan or inf: not JSON
        raise InputError(name, f"is not a JSON document: {e}") from None


def _named_or_document(name: str, value: Any) -> Tuple[List[str], Optional[str]]:
    if value is None:
        return [], None
    if isinstance(value, (str, os.PathLike)):
        return [f"{_flag(name)}={os.fspath(value)}"], None
    return [], _document(name, value)


def _run(command: str, options: Dict[str, Any], fsdp_as_data: bool = False) -> Tuple[str, List[str]]:
    """Runs `command` with the options as its flags; returns (stdout text, notes)."""
    options = dict(options)
    model_args, model_json = _named_or_document("model", options.pop("model", None))
    hardware_args, hardware_json = _named_or_document("hardware", options.pop("hardware", None))
    args = [command] + model_args + hardware_args
    for name, value in options.items():
        if name in _SWITCHES:
            if not isinstance(value, bool):
                raise TypeError(f"{name}: expected True or False, got {value!r}")
            if value:
                args.append(_flag(name))
        elif value is not None:
            args.append(f"{_flag(name)}={_text(name, value)}")
    return _shardplan.run(args, model_json, hardware_json, fsdp_as_data)


def _json(command: str, options: Dict[str, Any]) -> Any:
    return json.loads(_run(command, options)[0])


def estimate(
    *,
    model: Optional[Model] = None,
    params: Optional[Number] = None,
    layers: Optional[Number] = None,
    hardware: Optional[Hardware] = None,
    gpu_memory_GiB: Optional[Number] = None,
    job: Optional[Union[str, "os.PathLike[str]"]] = None,
    gpus: Optional[Number] = None,
    gpus_per_node: Optional[Number] = None,
    seq_len: Optional[Number] = None,
    global_batch: Optional[Number] = None,
    micro_batch: Optional[Number] = None,
    precision: Optional[str] = None,
    optimizer: Optional[str] = None,
    checkpointing: Optional[str] = None,
    attention: Optional[str] = None,
    recipe: Optional[str] = None,
    loss: Optional[str] = None,
    fsdp_mixed_precision: Optional[str] = None,
    compile: bool = False,
    fsdp2_groups: Optional[str] = None,
    float8: Optional[str] = None,
    float8_filter: Optional[Union[str, Sequence[str]]] = None,
    headroom: Optional[Number] = None,
    accounting: Optional[str] = None,
    strategy: Optional[str] = None,
    flavour: Optional[str] = None,
    shard_group_size: Optional[Number] = None,
    offload: Optional[str] = None,
    reduce_dtype: Optional[str] = None,
    backward_prefetch: Optional[str] = None,
    deepspeed: Optional[Union[str, "os.PathLike[str]"]] = None,
    tensor_parallel: Optional[Number] = None,
    sequence_parallel: bool = False,
    async_tensor_parallel: bool = False,
    pipeline_parallel: Optional[Number] = None,
    schedule: Optional[str] = None,
    virtual_stages: Optional[Number] = None,
    micro_batches: Optional[Number] = None,
    context_parallel: Optional[Number] = None,
    first_stage_less_layers: Optional[Number] = None,
    last_stage_less_layers: Optional[Number] = None,
    cp_rotate_method: Optional[str] = None,
) -> Dict[str, Any]:
    """Memory and step time of one plan: ``planner estimate --format json``."""
    return _json("estimate", dict(locals(), format="json"))


def simulate(
    *,
    trace: Union[str, "os.PathLike[str]"],
    model: Optional[Model] = None,
    params: Optional[Number] = None,
    layers: Optional[Number] = None,
    hardware: Optional[Hardware] = None,
    gpu_memory_GiB: Optional[Number] = None,
    job: Optional[Union[str, "os.PathLike[str]"]] = None,
    gpus: Optional[Number] = None,
    gpus_per_node: Optional[Number] = None,
    seq_len: Optional[Number] = None,
    global_batch: Optional[Number] = None,
    micro_batch: Optional[Number] = None,
    precision: Optional[str] = None,
    optimizer: Optional[str] = None,
    checkpointing: Optional[str] = None,
    attention: Optional[str] = None,
    recipe: Optional[str] = None,
    loss: Optional[str] = None,
    fsdp_mixed_precision: Optional[str] = None,
    compile: bool = False,
    fsdp2_groups: Optional[str] = None,
    float8: Optional[str] = None,
    float8_filter: Optional[Union[str, Sequence[str]]] = None,
    headroom: Optional[Number] = None,
    accounting: Optional[str] = None,
    strategy: Optional[str] = None,
    flavour: Optional[str] = None,
    shard_group_size: Optional[Number] = None,
    offload: Optional[str] = None,
    reduce_dtype: Optional[str] = None,
    backward_prefetch: Optional[str] = None,
) -> Dict[str, Any]:
    """``estimate``, and the step's Chrome trace written to ``trace`` (opens in Perfetto):
    ``planner simulate --trace PATH --format json``."""
    return _json("simulate", dict(locals(), format="json"))


def recommend(
    *,
    model: Optional[Model] = None,
    params: Optional[Number] = None,
    layers: Optional[Number] = None,
    hardware: Optional[Hardware] = None,
    gpu_memory_GiB: Optional[Number] = None,
    job: Optional[Union[str, "os.PathLike[str]"]] = None,
    gpus: Optional[Number] = None,
    gpus_per_node: Optional[Number] = None,
    seq_len: Optional[Number] = None,
    global_batch: Optional[Number] = None,
    micro_batch: Optional[Number] = None,
    precision: Optional[str] = None,
    optimizer: Optional[str] = None,
    checkpointing: Optional[str] = None,
    attention: Optional[str] = None,
    recipe: Optional[str] = None,
    loss: Optional[str] = None,
    fsdp_mixed_precision: Optional[str] = None,
    compile: bool = False,
    fsdp2_groups: Optional[str] = None,
    float8: Optional[str] = None,
    float8_filter: Optional[Union[str, Sequence[str]]] = None,
    headroom: Optional[Number] = None,
    accounting: Optional[str] = None,
    strategy: Optional[str] = None,
    flavour: Optional[str] = None,
    shard_group_size: Optional[Number] = None,
    offload: Optional[str] = None,
    reduce_dtype: Optional[str] = None,
    backward_prefetch: Optional[str] = None,
    top: Optional[Number] = None,
    exhaustive: bool = False,
    losses: Optional[str] = None,
    svg: Optional[Union[str, "os.PathLike[str]"]] = None,
    model_parallel: bool = False,
    data_parallel_only: bool = False,
) -> Dict[str, Any]:
    """Searches the plan space: ``planner recommend --format json`` (recommendation, candidates,
    rejected, bottleneck, search)."""
    return _json("recommend", dict(locals(), format="json"))


def compare(
    *,
    strategy: Optional[Union[str, Sequence[str]]] = None,
    model: Optional[Model] = None,
    params: Optional[Number] = None,
    layers: Optional[Number] = None,
    hardware: Optional[Hardware] = None,
    gpu_memory_GiB: Optional[Number] = None,
    job: Optional[Union[str, "os.PathLike[str]"]] = None,
    gpus: Optional[Number] = None,
    gpus_per_node: Optional[Number] = None,
    seq_len: Optional[Number] = None,
    global_batch: Optional[Number] = None,
    micro_batch: Optional[Number] = None,
    precision: Optional[str] = None,
    optimizer: Optional[str] = None,
    checkpointing: Optional[str] = None,
    attention: Optional[str] = None,
    recipe: Optional[str] = None,
    loss: Optional[str] = None,
    fsdp_mixed_precision: Optional[str] = None,
    compile: bool = False,
    fsdp2_groups: Optional[str] = None,
    float8: Optional[str] = None,
    float8_filter: Optional[Union[str, Sequence[str]]] = None,
    headroom: Optional[Number] = None,
    accounting: Optional[str] = None,
    offload: Optional[str] = None,
) -> List[Dict[str, Any]]:
    """Strategies side by side for one job (a list, or "ddp,zero3"): ``planner compare --format
    json``, one evaluation per strategy."""
    options = dict(locals(), format="json")
    if strategy is not None and not isinstance(strategy, str):
        options["strategy"] = ",".join(strategy)
    return _json("compare", options)


def _emit(kind: str, options: Dict[str, Any], fsdp_as_data: bool = False) -> Any:
    return json.loads(_run("recommend", dict(options, emit=kind), fsdp_as_data)[0])


def _plan_options(
    model: Optional[Model] = None,
    params: Optional[Number] = None,
    layers: Optional[Number] = None,
    hardware: Optional[Hardware] = None,
    gpu_memory_GiB: Optional[Number] = None,
    job: Optional[Union[str, "os.PathLike[str]"]] = None,
    gpus: Optional[Number] = None,
    gpus_per_node: Optional[Number] = None,
    seq_len: Optional[Number] = None,
    global_batch: Optional[Number] = None,
    micro_batch: Optional[Number] = None,
    precision: Optional[str] = None,
    optimizer: Optional[str] = None,
    checkpointing: Optional[str] = None,
    attention: Optional[str] = None,
    recipe: Optional[str] = None,
    loss: Optional[str] = None,
    fsdp_mixed_precision: Optional[str] = None,
    compile: bool = False,
    fsdp2_groups: Optional[str] = None,
    float8: Optional[str] = None,
    float8_filter: Optional[Union[str, Sequence[str]]] = None,
    headroom: Optional[Number] = None,
    accounting: Optional[str] = None,
    strategy: Optional[str] = None,
    flavour: Optional[str] = None,
    shard_group_size: Optional[Number] = None,
    offload: Optional[str] = None,
    reduce_dtype: Optional[str] = None,
    backward_prefetch: Optional[str] = None,
    exhaustive: bool = False,
    losses: Optional[str] = None,
) -> Dict[str, Any]:
    return dict(locals())


def deepspeed_config(**options: Any) -> Dict[str, Any]:
    """The DeepSpeed config (ds_config.json as a dict) of the best of DeepSpeed's plans:
    ``planner recommend --emit deepspeed``. Takes ``recommend``'s options but top and svg."""
    return _emit("deepspeed", _plan_options(**options))


def plan_document(**options: Any) -> Dict[str, Any]:
    """The best plan as the document ``executor --plan`` runs: ``planner recommend --emit plan``."""
    return _emit("plan", _plan_options(**options))


def fsdp_settings(**options: Any) -> Dict[str, Any]:
    """The best PyTorch plan's settings (``planner recommend --emit fsdp``) as data: strategy,
    flavour, torchtitan (sections of the 0.2.x TOML, and notes), fully_shard (FSDP2 plans only)
    and text (what the command line prints)."""
    return _emit("fsdp", _plan_options(**options), fsdp_as_data=True)


def llm_foundry_yaml(**options: Any) -> str:
    """The keys of llm-foundry's train YAML for the best of Composer's FSDP plans (``planner
    recommend --emit llm-foundry``; the recipe must be llm-foundry): the batch, max_seq_len,
    precision, fsdp_config and, for an MPT config, its model section, after comment lines that
    say what the plan assumes. Takes ``recommend``'s options but top and svg."""
    return _run("recommend", dict(_plan_options(**options), emit="llm-foundry"))[0]


def fsdp2_args(**options: Any) -> Dict[str, Any]:
    """The keyword arguments of FSDP2's ``fully_shard`` for the best FSDP2 plan (flavour fsdp2
    unless given): mesh (shape, mesh_dim_names), reshard_after_forward, mp_policy (param_dtype,
    reduce_dtype: torch dtype names such as "bfloat16"), offload_policy (type, pin_memory) and
    model_dtype (the dtype the model is cast to first, pure bf16; else None)."""
    options.setdefault("flavour", "fsdp2")
    if options["flavour"] != "fsdp2":
        raise InputError("flavour", f"fsdp2_args writes FSDP2's fully_shard arguments, got {options['flavour']!r}")
    return fsdp_settings(**options)["fully_shard"]


def torchtitan_options(version: str = "0.3.0", **options: Any) -> Dict[str, Any]:
    """torchtitan's options for the best PyTorch plan. version "0.3.0" (the default): its command
    line, {"args": the words after ``-m torchtitan.train --module M --config C`` (tyro options and
    the activation_checkpoint subcommand), "notes": [...]}. version "0.2": the job-config TOML's
    sections, {"training": {...}, "parallelism": {...}, "activation_checkpoint": {...},
    "notes": [...]}."""
    if version not in ("0.3.0", "0.2"):
        raise InputError("version", f'must be "0.3.0" or "0.2", got {version!r}')
    settings = fsdp_settings(**options)
    written = settings["torchtitan_command_line" if version == "0.3.0" else "torchtitan"]
    if written is None:  # a mixture of experts: torchtitan runs its own MoE code
        raise InputError("model", "torchtitan's options are not written for a mixture of experts: "
                                  "torchtitan runs its own MoE code, not the transformers block the "
                                  "plan counts")
    return written
