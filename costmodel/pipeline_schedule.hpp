// A pipeline schedule (documents/pipeline_order.hpp) walked: its ops timed with per-stage forward
// and backward durations and the data dependencies between stages. From the walk: the step's
// span, the bubble and the most micro-batches whose activations a stage holds at once.
#pragma once

#include <vector>

#include "documents/parallel.hpp"
#include "documents/pipeline_order.hpp"

namespace shardplan::costmodel {

struct PipelineWalk {
  double span_s = 0;           // first forward's start to last backward's end
  std::vector<double> busy_s;  // per stage: its ops' durations
  std::vector<double> end_s;   // per stage: when its last op ends
  // (span − the busiest stage's work) / that work: Narayanan et al. 2021's bubble time over ideal
  // time, (p−1)/m for 1F1B and GPipe and (p−1)/(m·v) interleaved with equal stage times.
  double bubble_fraction = 0;
  std::vector<int> peak_chunks;        // per stage: most chunk activations alive at once
  std::vector<double> peak_in_flight;  // the same in whole-stage micro-batches (chunks / v)
};

// forward_s[s], backward_s[s]: one micro-batch through all of stage s's layers (a chunk takes 1/v
// of it). p2p_s: the send/receive between two stages, added to a dependency that crosses stages.
PipelineWalk walk_schedule(documents::PipelineSchedule schedule, int p, int v, int m,
                           const std::vector<double>& forward_s,
                           const std::vector<double>& backward_s, double p2p_s = 0);
// The same walk of each stage's own op list (ops[s]: Megatron's schedule_ops, or torch's
// torch_interleaved_ops for torchtitan's pipeline).
PipelineWalk walk_ops(const std::vector<std::vector<documents::PipeOp>>& ops, int p, int v, int m,
                      const std::vector<double>& forward_s, const std::vector<double>& backward_s,
                      double p2p_s = 0);

}  // namespace shardplan::costmodel
