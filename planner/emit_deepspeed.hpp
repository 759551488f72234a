// `--emit deepspeed`: the DeepSpeed configuration (ds_config.json) that runs a ZeRO or DDP plan
// with the batch, precision, bucket, prefetch and offload settings the plan was costed with. Key
// names and defaults follow DeepSpeed's config reference (deepspeed.ai/docs/config-json) and the
// code that parses them (deepspeed/runtime/config.py, zero/config.py, zero/offload_config.py,
// precision_config.py).
#pragma once

#include <nlohmann/json.hpp>

#include "planner/estimate.hpp"
#include "planner/scenario.hpp"

namespace shardplan::planner {

// The DeepSpeed config for `e` (ddp → stage 0, zero1/2/3 → stage 1/2/3). Throws
// core::InputError at "--emit" for a plan DeepSpeed does not implement (fsdp-full,
// fsdp-grad-op, hsdp: "use --emit fsdp"), for a plan that is not runnable, and for a setting
// DeepSpeed has no switch for (pure bf16 without ZeRO). Sizes in the spec are bytes; DeepSpeed's
// bucket sizes are elements, so they are divided by the bytes of the dtype they hold.
nlohmann::json deepspeed_config(const Scenario& sc, const Evaluation& e);

}  // namespace shardplan::planner
