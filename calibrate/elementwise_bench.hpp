// The rate of the layers that are not GEMMs (documents/workload.hpp) on one CPU rank: the
// executor's own fp32 kernels run forward and backward at the model's widths, and their element
// passes, counted as the cost model counts them, divided by their time.
#pragma once

#include <cstdint>
#include <vector>

#include "documents/model.hpp"
#include "documents/workload.hpp"

namespace shardplan::calibrate {

// The model's element-wise layers, each counted as often as a step runs it: a block's × layers,
// the head's and the embeddings' once.
std::vector<documents::ElementwiseOp> model_elementwise_ops(const documents::ModelSpec& m);

// Element passes per second over `tokens` tokens (rows capped so that no buffer exceeds 16 Mi
// elements: the rate is per element). Each distinct layer is timed alone (the median of at least
// three runs of its forward and backward) and weighted by its count. head_dim: rotary's pairing.
double time_cpu_elementwise_rate(const std::vector<documents::ElementwiseOp>& ops,
                                 std::int64_t tokens, std::int64_t head_dim,
                                 double min_seconds = 0.02);

}  // namespace shardplan::calibrate
