// `--emit fsdp`: the PyTorch settings that run an FSDP, HSDP or DDP plan as it was costed: a short
// Python snippet (FSDP2 `fully_shard` with MixedPrecisionPolicy and OffloadPolicy on a device
// mesh; FSDP1 `FullyShardedDataParallel` for fsdp1 plans; DistributedDataParallel for ddp) and
// the matching torchtitan job-config fragment (TOML, keys of torchtitan/config/job_config.py).
#pragma once

#include <string>

#include "planner/estimate.hpp"
#include "planner/scenario.hpp"

namespace shardplan::planner {

// Throws costmodel::InputError at "--emit" for ZeRO plans ("use --emit deepspeed"), for a plan
// that is not runnable, and for an optimizer-only offload (FSDP offloads parameters, gradients
// and optimizer states together).
std::string fsdp_settings(const Scenario& sc, const Evaluation& e);

}  // namespace shardplan::planner
