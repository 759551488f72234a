// One optimizer step of a plan with tensor (+ sequence), pipeline and context parallelism beside
// the data-parallel ShardingSpec, as the step simulator walks it (simulator.hpp): one stage is the
// walk of one rank (its units split over the tensor ranks, its TP collectives on their own stream,
// the ring beside the attention); a pipeline is every stage's rank walked through its schedule's
// ops (pipeline_walk.hpp). What it reports per stage, and the summary of the stage that ends last.
#pragma once

#include <vector>

#include "costmodel/parallel_layout.hpp"
#include "costmodel/parallel_memory.hpp"
#include "costmodel/pipeline_schedule.hpp"
#include "costmodel/simulator.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/parallel.hpp"

namespace shardplan::costmodel {

// The activations sent between two stages per micro-batch, one direction: s/c·b·h elements, split
// by t under sequence parallelism (Megatron sends the sequence-parallel shard).
double p2p_bytes(const documents::ModelSpec& m, const documents::TrainingJob& j,
                 const documents::ParallelLayout& l, double e);

// Tied word embeddings under a pipeline: the all-reduce of the table's gradient between the first
// and the last stage (parallel_step.cpp says whose); empty when the model ties none or p = 1.
CollectiveCost tied_embedding_allreduce(const StepInput& in, const documents::ParallelLayout& l);

struct ParallelStep {
  StepResult step;        // the summary (peak, step time, exposed communication, MFU)
  ParallelMemory memory;  // per stage
  PipelineWalk walk;      // with the stages' real durations
  std::vector<double> stage_forward_s, stage_backward_s;  // per micro-batch, compute alone
  // The stage whose optimizer step ends last: the step's compute, bubble and waits are its.
  int step_stage = 0;
  double compute_per_mb_s = 0;  // that stage's compute per micro-batch (no comm)
  double tp_exposed_s = 0;      // per step on the busiest stage
  double cp_exposed_s = 0;
  double p2p_s = 0;      // one send between stages
  double bubble_s = 0;   // the walk's idle time of the busiest stage
  double dp_comm_s = 0;  // gradient reduction (+ parameter all-gathers) per step
  double dp_exposed_s = 0;
  // Tied embeddings under a pipeline: the word-embedding gradient all-reduced between the first
  // and the last stage after the data-parallel reduction (counted in dp_comm_s and dp_exposed_s of
  // those stages); bytes one rank sends.
  double embedding_allreduce_s = 0, embedding_bytes = 0;
  double tp_bytes = 0, cp_bytes = 0, pp_bytes = 0, dp_bytes = 0;  // per step, one rank of stage 0
};

// Never throws for a plan that cannot run or fit: step.valid and step.reason say why.
ParallelStep simulate_parallel_step(const StepInput& in, const documents::ParallelLayout& layout);

// A bound below simulate_parallel_step's step time that costs no walk of the micro-batches
// (pipeline_step_bound), for the layouts whose pipeline is walked; 0 (no bound) for the others.
double parallel_step_bound(const StepInput& in, const documents::ParallelLayout& layout);

}  // namespace shardplan::costmodel
