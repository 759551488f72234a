// Pipeline parallelism: the model's units split over p stages, micro-batches flowing through them
// in the order of a pipeline schedule, activations and their gradients passed between
// neighbouring stages by point-to-point messages; data parallelism (DDP) over the d = world / p
// ranks of each stage.
//
//   stage s of p holds blocks [s·L/p, (s+1)·L/p); stage 0 the embedding before them, stage p − 1
//   the final norm, the head and the loss after them (Megatron-LM's GPTModel pre_process /
//   post_process; torchtitan's pipeline split of a Llama).
//
// Each stage runs its list of forward and backward steps from documents::schedule_ops (1F1B,
// GPipe, or interleaved 1F1B with v model chunks per stage), the same lists the cost model walks
// for the bubble and the in-flight micro-batches. With chunks, chunk c of stage s is virtual
// stage g = c·p + s (chunk_units): the virtual stages form a ring, chunk c of stage 0 following
// chunk c − 1 of stage p − 1. A forward of virtual stage g > 0 receives its input [N, h] from the
// stage of g − 1; one of g < p·v − 1 sends its output to the stage of g + 1; a backward receives
// d output from g + 1 and sends d input to g − 1. When a send is followed by a step that receives
// from the same neighbour, the two are one exchange (Communicator::send_recv), as Megatron's
// send_forward_recv_backward and send_backward_recv_forward are
// (megatron/core/pipeline_parallel/p2p_communication.py): two neighbours in the 1F1B steady state
// send to each other at the same time. With chunks a send and the next step's receive from the
// other neighbour are one exchange too (send_forward_recv_forward): around the ring every stage
// sends while it waits to receive.
//
// Gradients accumulate over the m micro-batches of the step, each micro-batch's loss scaled by
// 1 / (m·d), and are all-reduced (summed) over the stage's data-parallel group once, after the
// last backward; AdamW then steps each stage's own parameters. A tied head (GPT-2's lm_head =
// wte) is a second copy of the embedding unit on the last stage, initialised identically; its
// gradient and the first stage's embedding gradient are all-reduced between the two stages before
// the step, so both copies take the same update (Megatron's embedding group,
// megatron/core/distributed/finalize_model_grads.py _allreduce_word_embedding_grads).
//
// Ranks (mesh order pp outermost, documents/parallel.hpp): stage s holds world ranks
// [s·d, (s+1)·d); data-parallel index r = rank mod d. Data: micro-batch k of data-parallel index r
// in step t holds sequences (t−1)·b·m·d + (k·d + r)·b … + b − 1 of synthetic_sequences, the
// sequences the sharding engine's micro-batch k·d + r holds on one rank with m·d micro-batches.
//
// Memory: parameters, gradients and AdamW's two moments of the stage's units are allocated once
// (parameters, gradients, optimizer_states); activations are the model's, kept per micro-batch
// from its forward to its backward; received tensors and the tokens of the in-flight micro-batches
// (first and last stage) are activations too.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "comm/communicator.hpp"
#include "documents/model.hpp"
#include "documents/parallel.hpp"
#include "executor/gpt_model.hpp"
#include "executor/tracked_allocator.hpp"
#include "kernels/adamw.hpp"

namespace shardplan::executor {

// clang-tidy 14 says its (noexcept) default constructor may throw, through ModelSpec's json
// (documents/model.hpp says why that is a false positive).
struct PipelineOptions {  // NOLINT(bugprone-exception-escape)
  documents::ModelSpec model;
  BatchShape micro_batch;  // b sequences × T tokens
  int stages = 1;          // p
  int micro_batches = 1;   // m per pipeline per optimizer step
  documents::PipelineSchedule schedule = documents::PipelineSchedule::one_f_one_b;
  int virtual_stages = 1;  // v: model chunks per stage (interleaved-1f1b only)
  // Tensor parallelism within each stage (tensor_parallel.hpp) over t consecutive ranks, with
  // sequence parallelism or not; `model` is the whole model.
  int tensor_parallel = 1;
  bool sequence_parallel = false;
  // Megatron-core's distributed optimizer (ZeRO-1) over the stage's d data-parallel ranks
  // (optimizer_shards = d; 1: DDP, every rank holds the moments whole). AdamW's moments of a unit
  // of n elements are split in ranges of ⌈n/d⌉: data-parallel rank i holds and steps elements
  // [i·⌈n/d⌉, min(n, (i+1)·⌈n/d⌉)). The gradients are all-reduced whole as under DDP (the same
  // sums as Megatron's reduce-scatter, beside its whole gradient buffer); each rank then steps its
  // range and the ranges are broadcast from their owners (the all-gather of the updated
  // parameters: megatron/core/optimizer/distrib_optimizer.py).
  int optimizer_shards = 1;
  Checkpointing checkpointing = Checkpointing::none;
  kernels::AdamWOptions adamw;
  std::uint64_t seed = 1234;  // initial parameters and tokens, as the sharding engine's
  ModelOptions model_options;
};

// Units [first, last) of stage `stage` (0 the embedding, 1..L the blocks, L + 1 the head).
struct StageUnits {
  std::int64_t first = 0, last = 0;
};
StageUnits stage_units(std::int64_t layers, int stages, int stage);
// Of model chunk `chunk` of stage `stage` under the interleaved schedule: virtual stage
// g = chunk·p + stage holds blocks [g·L/(p·v), (g+1)·L/(p·v)), the embedding before virtual
// stage 0 and the head after the last (Megatron-LM's model chunks).
StageUnits chunk_units(std::int64_t layers, int stages, int virtual_stages, int stage, int chunk);

// Throws core::InputError naming the flag and the value when the pipeline cannot run:
// --pipeline-parallel < 1, not dividing the world or the layers; --micro-batches < 1; an
// interleaved schedule (one model chunk per stage only).
void check_pipeline(const PipelineOptions& options, int world);

// What one rank of stage `stage` holds at its peak, in bytes, as PipelineTrainer allocates it
// (fp32), with the most micro-batches in flight on the stage in the schedule's order
// (documents::peak_chunks):
//   states      parameters, gradients, AdamW's two moments: 16 bytes per element of the stage's
//               units (and of the embedding's copy on a tied last stage); with the distributed
//               optimizer the moments of data-parallel rank 0's ranges (the largest, ⌈n/d⌉)
//   saved       per in-flight micro-batch: the blocks' block_saved_bytes, the tokens (inputs and
//               targets, int32) on the first and last stage, head_saved_bytes on the last
//   transient   the largest of: a block's backward (its input gradient dy and the MLP's input
//               gradient [N, h] each, with d_act, d_pre (and SwiGLU's d_up) [N, I] in place of
//               the freed mlp_act: 2·N·h + N·I, + N·I more for SwiGLU, at swiglu/gelu_backward),
//               the head's backward (head_backward_bytes, the two [N, V] gradients) on the last
//               stage, a forward's output beside the received tensor of the exchange after it
//               (2·N·h) on the others
struct StagePeak {
  std::int64_t states = 0, saved = 0, transient = 0;  // saved: the largest chunk's
  int in_flight = 0;                                  // chunks alive at once, at the most
  std::int64_t held = 0;  // their saved bytes at the most (in_flight · saved with one chunk)
  std::int64_t total() const { return states + held + transient; }
};
// Without tensor parallelism (options.tensor_parallel = 1; std::invalid_argument otherwise).
StagePeak stage_peak(const PipelineOptions& options, int stage);

// The groups of a pipeline run, made from the world (collective over it). Owned.
struct PipelineGroups {
  std::unique_ptr<comm::Communicator> pipeline;  // the p stages of this data-parallel index;
                                                 // rank = stage
  std::unique_ptr<comm::Communicator> data;      // the d ranks of this stage
  std::unique_ptr<comm::Communicator> tied;    // stages 0 and p − 1 (p > 1), else a group of one
  std::unique_ptr<comm::Communicator> tensor;  // the t ranks splitting this stage's linears
};
// Mesh order pp, dp, tp (outermost first): stage s holds world ranks [s·d·t, (s+1)·d·t), of which
// rank s·d·t + i·t + r is data-parallel index i and tensor-parallel rank r.
PipelineGroups make_pipeline_groups(comm::Communicator& world, int stages, int tensor_parallel = 1);

struct PipelineReport {
  std::int64_t step = 0;  // 1-based
  double loss = 0;        // mean over the global batch, from the last stage, on every rank
  double step_s = 0;
  double forward_s = 0, backward_s = 0;  // compute of this stage's units
  double p2p_s = 0;                      // sends and receives (waits for the neighbours included)
  double reduce_s = 0;                   // the data-parallel and tied all-reduces
  double optimizer_s = 0;
};

class PipelineTrainer {
public:
  // Allocates the stage's parameters, gradients and moments. Throws InputError as
  // check_pipeline, std::invalid_argument when the groups do not match the options.
  PipelineTrainer(PipelineOptions options, TrackedAllocator& allocator, PipelineGroups& groups);
  ~PipelineTrainer();
  PipelineTrainer(const PipelineTrainer&) = delete;
  PipelineTrainer& operator=(const PipelineTrainer&) = delete;

  // One optimizer step. Collective over the world.
  PipelineReport step();

  int stage() const;
  std::vector<StageUnits> units() const;  // one range per model chunk
  const GptLayout& layout() const;
  // Unit u's parameters when this stage holds it (the embedding on the last stage too when the
  // head is tied); throws std::out_of_range otherwise.
  std::span<const float> parameters(std::int64_t unit) const;

  struct Impl;

private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardplan::executor
