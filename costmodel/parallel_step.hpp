// One optimizer step of a plan with tensor (+ sequence), pipeline and context parallelism beside
// the data-parallel ShardingSpec. One stage of a framework's recipe with context parallelism, or
// with PyTorch's TP plans (hf's tp_plan, torchtitan's apply_tp) without it, is the step
// simulator's walk of one rank (simulator.hpp: StepInput::context_parallel, tensor_parallel): its
// units split, its TP collectives on their own stream, the ring beside the attention. Otherwise
// (Megatron-core's TP, pipelines, the executor's own model) each pipeline stage's forward and
// backward per micro-batch are timed from its GEMM FLOPs split by t, with tensor parallelism's
// collectives (exposed unless async), the ring exchanges of context parallelism (exposed beyond
// the attention they overlap), and the schedule is walked (pipeline_schedule.hpp) with the
// point-to-point sends between stages. The data-parallel gradient reduction over world/(t·p·c)
// ranks and the optimizer step follow each stage's last backward. Memory per stage:
// parallel_memory.hpp.
//
// A unit's compute on a rank is the step walk's (compute_time.hpp: GEMMs by shape, the attention
// core, the memory-bound ops, the host's issuing of the kernels), split over the tensor-parallel
// ranks (TensorSplit). What this analytic path leaves out that the walk counts: the per-unit
// prefetch of FSDP's all-gathers (one gather per step under a pipeline; per micro-batch
// otherwise, overlapped with compute but for the first), bucketing, offload.
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

// Bytes one rank sends for tensor parallelism per transformer block and micro-batch, forward and
// backward (without recompute). Megatron-LM (Shoeybi et al. 2019, §3; Narayanan et al. 2021,
// §3.2): two all-reduces of the s·b·h activations in the forward (after the attention's and the
// MLP's row-parallel linears) and two in the backward (the column-parallel linears' input
// gradients); a ring all-reduce sends 2(t−1)/t of its buffer. With sequence parallelism
// (Korthikanti et al. 2022, §4.2.2) each all-reduce becomes an all-gather and a reduce-scatter of
// the same buffer, (t−1)/t each: the same bytes.
double tp_bytes_per_block(const documents::ModelSpec& m, const documents::TrainingJob& j,
                          const documents::ParallelLayout& l, double e);
// Bytes one rank sends for ring attention per block and micro-batch, forward and backward: c − 1
// steps of its K and V chunk (e·(s/c)·b·kv/t each) in the forward; the backward passes K, V and
// their gradients: twice that.
double cp_bytes_per_block(const documents::ModelSpec& m, const documents::TrainingJob& j,
                          const documents::ParallelLayout& l, double e);
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
