// `planner estimate --deepspeed ds_config.json`: a user's existing DeepSpeed config read into the
// ShardingSpec and TrainingJob it describes. Every key is understood, or ignored with a stated
// assumption, or rejected with its JSON pointer; nothing is dropped silently. Key names, defaults
// and aliases follow DeepSpeed's parsers (deepspeed/runtime/config.py, zero/config.py,
// zero/offload_config.py, precision_config.py, activation_checkpointing/config.py); "auto" values
// are filled the way the Hugging Face Trainer fills them (transformers/integrations/deepspeed.py),
// from the scenario.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "documents/job.hpp"
#include "documents/sharding.hpp"
#include "planner/scenario.hpp"

namespace shardplan::planner {

struct DeepSpeedImport {
  documents::ShardingSpec spec;  // zero<stage> (deepspeed flavour) or ddp for stage 0
  documents::TrainingJob job;    // micro_batch 0: "auto" with no --micro-batch, the planner chooses
  std::vector<std::string> assumptions;  // one line per key ignored or filled in
};

// Reads `ds` for the cluster and job of `base` (GPU count, sequence length, attention,
// checkpointing and, for "auto" values, batch sizes and precision). The batch keys must agree
// with base.cluster.gpus. Throws core::InputError naming the JSON pointer.
DeepSpeedImport import_deepspeed_config(const nlohmann::json& ds, const Scenario& base);

}  // namespace shardplan::planner
