// `--emit fsdp`: the PyTorch settings that run an FSDP, HSDP or DDP plan as it was costed: a short
// Python snippet (FSDP2 `fully_shard` with MixedPrecisionPolicy and OffloadPolicy on a device
// mesh; FSDP1 `FullyShardedDataParallel` for fsdp1 plans; DistributedDataParallel for ddp) and
// the matching torchtitan job-config fragment (TOML, keys of torchtitan/config/job_config.py).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "planner/estimate.hpp"
#include "planner/scenario.hpp"

namespace shardplan::planner {

// Throws core::InputError at "--emit" for ZeRO plans ("use --emit deepspeed"), for a plan
// that is not runnable, and for an optimizer-only offload (FSDP offloads parameters, gradients
// and optimizer states together).
std::string fsdp_settings(const Scenario& sc, const Evaluation& e);
// The same settings as data, refusing what fsdp_settings refuses: {"strategy", "flavour",
// "torchtitan": {section: {key: value}, "notes": [...]}, "fully_shard" (FSDP2 plans only): {"mesh",
// "reshard_after_forward", "mp_policy", "offload_policy", "model_dtype"}, "text": fsdp_settings}.
nlohmann::json fsdp_settings_json(const Scenario& sc, const Evaluation& e);

}  // namespace shardplan::planner
