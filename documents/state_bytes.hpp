// Bytes per parameter element of each model state as a flavour keeps it under a precision: the
// cost model's memory and the executor's precision policy both read this one table.
#pragma once

#include "documents/job.hpp"
#include "documents/sharding.hpp"

namespace shardplan::documents {

struct StateBytes {
  double param = 0;      // parameter storage at rest (the sharded part divided by the shard group)
  double grad = 0;       // gradient storage kept across micro-batches
  double master = 0;     // separate fp32 master copy (counted with optimizer states)
  double moment = 0;     // per optimizer-state element (costmodel::optimizer_state_elements)
  double compute = 0;    // gathered parameters and freshly computed gradients (compute dtype)
  double step_grad = 0;  // transient gradient copy the optimizer step makes (DeepSpeed fp32 cast)
};

// What the flavour really keeps under the precision (its buffers, copies and partitions).
StateBytes state_bytes(Precision p, const ShardingSpec& spec);

}  // namespace shardplan::documents
