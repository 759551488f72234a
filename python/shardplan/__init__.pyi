# Typing stub of the shardplan package: the keyword arguments of every function, for editors and
# type checkers. The options are the planner's flags with underscores; numbers may also be text.
import os
from typing import Any, Dict, List, Mapping, Sequence, TypedDict, Union

from typing_extensions import Unpack

_Path = Union[str, os.PathLike[str]]
# A preset name, a config.json path, a config.json as a dict, or a transformers config object.
Model = Union[_Path, Mapping[str, Any], Any]
# A profile name, a profile file's path, or a profile as a dict.
Hardware = Union[_Path, Mapping[str, Any]]
Number = Union[int, float, str]

__version__: str  # the project's version, as `planner --version` prints it

class InputError(ValueError):
    field: str  # the keyword argument ("global_batch") or the place in a document
    message: str
    def __init__(self, where: str, message: str) -> None: ...

class ScenarioOptions(TypedDict, total=False):
    model: Model
    params: Number  # a bare parameter count instead of a model
    layers: Number  # blocks of a bare count
    hardware: Hardware
    gpu_memory_GiB: Number
    job: _Path  # a training-job document
    gpus: Number
    gpus_per_node: Number
    seq_len: Number
    global_batch: Number  # sequences per optimizer step, whole job
    micro_batch: Number  # sequences per GPU per forward/backward (searched when absent)
    precision: str  # fp32 | bf16-mixed | fp16-mixed | bf16
    optimizer: str  # adamw | adam | sgd | adafactor
    checkpointing: str  # none | full | every:N | selective-attention | selective-op
    attention: str  # flash | eager
    recipe: str  # hf | torchtitan | llm-foundry | megatron | deepspeed | executor
    loss: str  # upcast | fused | chunked:N | fused-linear | fp32-inplace
    fsdp_mixed_precision: str  # default | pure | full (Composer's names for FSDP's MixedPrecision)
    compile: bool  # torch.compile as the recipe runs it (torchtitan: each block and the loss)
    fsdp2_groups: str  # root | ends (FSDP2's parameter groups; not given: the recipe's)
    float8: str  # none | rowwise | rowwise_with_gw_hp (torchao's Float8 training of the linears)
    float8_filter: Union[str, Sequence[str]]  # module names Float8 skips (torchtitan's filter_fqns)
    headroom: Number  # fraction of GPU memory kept free
    accounting: str  # framework | zero-paper

class PlanOptions(ScenarioOptions, total=False):
    strategy: str  # ddp | zero1 | zero2 | zero3 | fsdp-full | fsdp-grad-op | hsdp | none
    flavour: str  # ddp | fsdp1 | fsdp2 | deepspeed
    shard_group_size: Number
    offload: str  # none | optimizer | params
    reduce_dtype: str  # fp32 | bf16 | fp16 (FSDP's reduce_dtype, DeepSpeed's communication dtype)
    backward_prefetch: str  # pre | none (FSDP1's backward_prefetch; not given: the recipe's)

class EstimateOptions(PlanOptions, total=False):
    deepspeed: _Path  # an existing ds_config.json instead of strategy
    tensor_parallel: Number  # t, inside a node
    sequence_parallel: bool
    async_tensor_parallel: bool
    pipeline_parallel: Number  # p stages
    schedule: str  # 1f1b | interleaved-1f1b | gpipe
    virtual_stages: Number  # model chunks per stage (interleaved-1f1b)
    micro_batches: Number  # per step through the pipeline
    context_parallel: Number  # c (ring attention)
    first_stage_less_layers: Number  # blocks the first stage gives up for the embeddings
    last_stage_less_layers: Number  # blocks the last stage gives up for the head
    cp_rotate_method: str  # allgather | alltoall (torch's ring: how keys and values go round)

class EmitOptions(PlanOptions, total=False):
    exhaustive: bool
    losses: str  # comma list the search may choose besides the recipe's own loss (fused-linear, chunked:N)

class RecommendOptions(EmitOptions, total=False):
    top: Number
    svg: _Path
    model_parallel: bool  # search tensor, pipeline and context parallelism too
    data_parallel_only: bool  # never widen the search to model parallelism

class CompareOptions(ScenarioOptions, total=False):
    strategy: Union[str, Sequence[str]]  # one or a list
    offload: str

def estimate(**options: Unpack[EstimateOptions]) -> Dict[str, Any]: ...
def simulate(*, trace: _Path, **options: Unpack[PlanOptions]) -> Dict[str, Any]: ...
def recommend(**options: Unpack[RecommendOptions]) -> Dict[str, Any]: ...
def compare(**options: Unpack[CompareOptions]) -> List[Dict[str, Any]]: ...
def deepspeed_config(**options: Unpack[EmitOptions]) -> Dict[str, Any]: ...
def plan_document(**options: Unpack[EmitOptions]) -> Dict[str, Any]: ...
def fsdp_settings(**options: Unpack[EmitOptions]) -> Dict[str, Any]: ...
def llm_foundry_yaml(**options: Unpack[EmitOptions]) -> str: ...
def fsdp2_args(**options: Unpack[EmitOptions]) -> Dict[str, Any]: ...
def torchtitan_options(version: str = "0.3.0", **options: Unpack[EmitOptions]) -> Dict[str, Any]: ...
