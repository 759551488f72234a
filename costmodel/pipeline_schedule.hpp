// A pipeline schedule written out and walked: each stage's explicit list of forward and backward
// ops (micro-batch, model chunk), run in list order with the data dependencies between stages,
// timed with per-stage forward and backward durations. From the walk: the step's span, the bubble
// and the most micro-batches whose activations a stage holds at once.
//
// The lists follow Megatron-LM's schedules (megatron/core/pipeline_parallel/schedules.py):
// forward_backward_pipelining_without_interleaving (1F1B: p − s − 1 warm-up forwards on stage s,
// then one forward one backward, then the cool-down backwards) and
// forward_backward_pipelining_with_interleaving (v chunks per stage, chunk k of stage s being
// virtual stage k·p + s; micro-batches go through the chunks in groups of p; warm-up
// 2·(p − s − 1) + (v − 1)·p forwards, all of them when m = p). GPipe runs all forwards, then all
// backwards.
#pragma once

#include <vector>

#include "costmodel/parallel_layout.hpp"

namespace shardplan::costmodel {

enum class PipeOpKind { forward, backward };
struct PipeOp {
  PipeOpKind kind;
  int micro_batch;  // 0 .. m−1
  int chunk;        // model chunk on this stage, 0 .. v−1 (virtual stage chunk·p + stage)
};

// ops[s]: stage s's ops in the order it runs them. p >= 1, v >= 1 (v > 1 for interleaved only),
// m >= 1; interleaved needs m a multiple of p (layout_problems says so; here it is a logic_error).
std::vector<std::vector<PipeOp>> schedule_ops(PipelineSchedule schedule, int p, int v, int m);

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
PipelineWalk walk_schedule(PipelineSchedule schedule, int p, int v, int m,
                           const std::vector<double>& forward_s,
                           const std::vector<double>& backward_s, double p2p_s = 0);

}  // namespace shardplan::costmodel
