// A pipeline's step walked: every stage's rank is the step simulator's walk (simulator.hpp) of
// its own units (its model chunks' blocks, the embeddings on the first, the head on the last),
// running its schedule's ops (the order the recipe's pipeline runs: parallel_memory.hpp,
// stage_orders) one at a time, each once its input has arrived: a forward once the previous
// virtual stage's forward of that micro-batch has ended and its activations have been sent, a
// backward once the next one's backward has sent its gradient. Time and memory follow that one
// order. After its last backward each stage reduces over its data-parallel group, all-reduces a
// tied embedding's gradient between the first and the last stage, and steps.
#pragma once

#include <vector>

#include "costmodel/pipeline_schedule.hpp"
#include "costmodel/simulator.hpp"
#include "documents/parallel.hpp"

namespace shardplan::costmodel {

struct PipelineStages {
  std::vector<StepResult> stages;  // each stage's rank, its step_s when its optimizer step ends
  // span, per stage: its end, its busy time (its ops with the waits inside them: the end less
  // the bubble) and the chunks in flight
  PipelineWalk walk;
  double p2p_s = 0;                                       // one send between stages
  double p2p_bytes = 0;                                   // bytes stage 0 sends per step
  double embedding_allreduce_s = 0, embedding_bytes = 0;  // a tied table's, first and last stage
  bool valid = true;
  std::string reason, reason_input;
};

// `rank`: the job as one rank runs it (its t, c, sequence parallelism set); p >= 2, no offload.
PipelineStages walk_pipeline(const StepInput& rank, const documents::ParallelLayout& l);

// A bound below walk_pipeline's step time from the stages' compute alone, without walking the
// micro-batches (pipeline_walk.cpp says how); 0 where the plan cannot run (the walk says why).
double pipeline_step_bound(const StepInput& rank, const documents::ParallelLayout& l);

}  // namespace shardplan::costmodel
