// What a plan's pipeline schedule means: each stage's explicit list of forward and backward ops
// (micro-batch, model chunk), run in list order with the data dependencies between stages. The
// planner walks these lists with durations (costmodel/pipeline_schedule.hpp); the executor's
// stages run them.
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

#include "documents/parallel.hpp"

namespace shardplan::documents {

enum class PipeOpKind { forward, backward };
struct PipeOp {
  PipeOpKind kind;
  int micro_batch;  // 0 .. m−1
  int chunk;        // model chunk on this stage, 0 .. v−1 (virtual stage chunk·p + stage)
};

// ops[s]: stage s's ops in the order it runs them. p >= 1, v >= 1 (v > 1 for interleaved only),
// m >= 1; interleaved needs m a multiple of p (layout_problems says so; here it is a logic_error).
std::vector<std::vector<PipeOp>> schedule_ops(PipelineSchedule schedule, int p, int v, int m);

// The most bytes one stage holds at once when each forward keeps its chunk's bytes[chunk] until
// the backward of the same micro-batch and chunk frees them; the stage's ops run one at a time in
// list order, so the list is the order of its allocations and frees. It depends on the order
// only, not on the ops' durations.
double peak_held(const std::vector<PipeOp>& stage_ops, const std::vector<double>& bytes);
// Per stage: the most chunks alive at once (peak_held with one unit per chunk).
std::vector<int> peak_chunks(const std::vector<std::vector<PipeOp>>& ops);

}  // namespace shardplan::documents
