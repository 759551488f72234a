// The sharding engine: one optimizer step of a GPT model over a group of ranks, driven only by the
// plan's ShardingSpec: a strategy is a configuration, not a code path. DDP, ZeRO-1/2/3, FSDP's
// strategies and HSDP are the same code with different switches:
//
//   shard_parameters        parameters are chunks at rest; a unit is all-gathered before it runs
//   reshard_after_forward   ...and freed after its forward (kept for the backward otherwise; the
//                           last unit, and with keep_root_unsharded the first, always kept)
//   shard_gradients         a unit's full gradient lives only for its micro-batch; it is
//                           reduce-scattered into a kept chunk after every micro-batch
//   shard_optimizer         AdamW state is a chunk; gradients are reduce-scattered (all-reduced
//                           otherwise); unpartitioned parameters are all-gathered after the step
//   all_reduce_partitions   ZeRO-1/2 as DeepSpeed: the unit's gradient is all-reduced whole and
//                           the rank keeps its chunk of the sum
//   shard_group_size        HSDP: the above within S consecutive ranks, then an all-reduce of the
//                           reduced chunk across the world / S replicas
//   reduce_bucket_bytes     DDP: gradients all-reduced in buckets of this size; with
//   grad_bucket_copy          a second gradient copy the buckets live in (torch DDP's buckets)
//   contiguous_grad_bucket  DeepSpeed: one preallocated bucket the gradients are copied into;
//                           reduced when it fills
//   forward/backward_prefetch, max_inflight_allgathers   see EngineOptions::prefetch_as_planned
//   persistence_threshold   units whose tensors are all smaller stay whole (shard_layout.hpp)
//   offload                 optimizer / params: master, moments, reduced gradients (and the
//                           partitioned parameters) in a host pool of their own, not the
//                           device's allocator (host_offload.hpp)
//
// Memory follows the cost model's timeline (costmodel/simulator.cpp) allocation by allocation,
// every buffer through the TrackedAllocator with the cost model's category: gathered units are
// `buffers`; whole gradients (unsharded) are `gradients` allocated at their first use in a step and
// freed after the step; a sharded gradient's full per-micro-batch copy and its kept chunk are
// `gradients`; AdamW's moments are `optimizer_states`; DDP's bucket copy and DeepSpeed's
// contiguous bucket are `buffers`; activations are the model's.
//
// A tied head (GPT-2) reads the embedding matrix: under sharded parameters the head's gather
// includes the embedding unit again (the cost model's head gather adds the embedding matrix; the
// executor gathers the whole embedding unit, so a learned position table too), and its backward
// adds into the embedding unit's gradient, which therefore exists from the head's backward to the
// embedding's reduction, as in PyTorch and the cost model.
//
// Mixed precision (bf16-mixed, fp16-mixed) as the cost model's framework accounting
// (documents/state_bytes.hpp, costmodel/simulator.cpp): the model computes in the 16-bit type S,
// the optimizer in fp32 on master weights, and what is kept in which type follows the flavour:
//   PyTorch (ddp, fsdp1, fsdp2)  parameters at rest are fp32 and are the master weights. FSDP
//                                casts a unit's chunk to S and all-gathers it in S; DDP (autocast)
//                                makes S copies of a unit's weights (`buffers`) that live from its
//                                forward to the end of its backward. Kept gradients are fp32 (the
//                                autograd leaf's dtype): FSDP reduce-scatters S and adds the chunk
//                                into an fp32 chunk; DDP widens each unit's S gradient into its
//                                fp32 gradient and all-reduces fp32.
//   DeepSpeed                    an S parameter partition and an fp32 master partition
//                                (`optimizer_states`); gradients in S (a stage-3 partition in
//                                fp32), reduced in S; the step widens S gradients into an fp32
//                                transient, updates the master and rounds it into the S partition.
// fp16-mixed scales the loss dynamically as torch.cuda.amp.GradScaler does: from 2^16, halved
// and the step skipped when any rank's gradients are not finite, doubled after 2000 good steps.
//
// Gradient accumulation as the cost model: gradients are reduced on every micro-batch when they
// are sharded, only on the last one otherwise. MPI sums, so the loss of each micro-batch is scaled
// by 1 / (micro-batches · ranks): the reduced gradient is the mean over the global batch.
//
// Data: sequence i of the global batch of step t is synthetic_sequences' sequence
// t·global_batch + i; micro-batch k of rank r holds sequences (k·world + r)·b … + b − 1, so a run
// on one rank with world × k micro-batches sees the same sequences as a run on `world` ranks.
//
// The engine's parts (engine_state.hpp lists them): its state, the gather scheduler, the gradient
// buffers and buckets, the optimizer step with its loss scaler, and the step loop (engine.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/watchdog.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/sharding.hpp"
#include "documents/state_bytes.hpp"
#include "executor/collective_stats.hpp"
#include "executor/gpt_model.hpp"
#include "executor/shard_layout.hpp"
#include "executor/tracked_allocator.hpp"
#include "kernels/adamw.hpp"
#include "kernels/backend.hpp"
#include "kernels/scalar.hpp"

namespace shardplan::executor {

struct EngineOptions {
  documents::ModelSpec model;  // the model that runs
  documents::ShardingSpec spec;
  BatchShape micro_batch;              // sequences per micro-batch × tokens per sequence
  std::int64_t grad_accumulation = 1;  // micro-batches per optimizer step on each rank
  Checkpointing checkpointing = Checkpointing::none;
  kernels::AdamWOptions adamw;
  std::uint64_t seed = 1234;  // initial parameters and tokens
  // Prefetch. The plan's forward/backward_prefetch and max_inflight_allgathers say how far ahead
  // a GPU framework issues all-gathers so that they overlap compute (on CPUs too with collective
  // streams, comm/host_stream.hpp). Where collectives block the computing thread (plain MPI
  // calls on CPUs) nothing can overlap: the engine gathers
  // a unit when it is about to run, which is also what the cost model predicts for a CPU profile
  // (collectives serialised with compute: a prefetched gather starts after the previous unit's
  // compute, when that unit's gathered buffer is already freed). With prefetch_as_planned the
  // engine issues the gathers ahead anyway, in the framework's order: before a unit runs it
  // gathers the next `prefetch` units the rate limiter allows, so that many more gathered units
  // are alive, as on a GPU.
  bool prefetch_as_planned = false;
  // The model's options (norm ε, rotary θ, flash attention).
  ModelOptions model_options;
  // The precision policy (documents/job.hpp): fp32, bf16-mixed or fp16-mixed; with the spec's
  // flavour it says what is kept in which type (see the comment at the top).
  documents::Precision precision = documents::Precision::fp32;
  // Where the model and the engine compute, the one of the policy's compute type (not owned;
  // nullptr: the host). The allocator the engine is given must hand out that backend's memory.
  // fp16-mixed: the first loss scale (GradScaler's init_scale).
  double initial_loss_scale = 65536.0;
  kernels::Backend<float>* backend = nullptr;
  kernels::Backend<kernels::bf16>* backend_bf16 = nullptr;
  kernels::Backend<kernels::f16>* backend_f16 = nullptr;
  // Told what the step does ("step 2 forward unit 3") as it goes, so that a rank that stops is
  // named with its phase (comm/watchdog.hpp). Not owned; nullptr: nobody watches.
  comm::Watchdog* watchdog = nullptr;
};

// What a precision policy keeps in which type (see the comment at the top), from the cost model's
// bytes per state (documents::state_bytes) so that what the engine keeps is what the cost model
// counts. All false for fp32.
struct PrecisionPolicy {
  bool low_params = false;       // parameters at rest in 16 bits, an fp32 master beside (DeepSpeed)
  bool autocast_copies = false;  // 16-bit copies of fp32 parameters while a unit is in use (DDP)
  bool low_whole_grads = false;  // whole gradients kept in 16 bits (DeepSpeed ZeRO-1), else fp32
  bool low_kept_chunk = false;   // reduced chunks kept in 16 bits (DeepSpeed ZeRO-2), else fp32
  bool loss_scaling = false;     // fp16: dynamic loss scaling
};
// Throws std::invalid_argument for what the engine does not run: pure bf16 (bf16 optimizer
// states), a reduce dtype other than the type the gradients are in.
PrecisionPolicy precision_policy(documents::Precision precision,
                                 const documents::ShardingSpec& spec);

// The groups the engine's collectives run in. Not owned.
struct EngineGroups {
  comm::Communicator* world = nullptr;    // every rank
  comm::Communicator* shard = nullptr;    // the shard group (the world without HSDP): all-gathers
  comm::Communicator* replica = nullptr;  // across shard groups; nullptr with a single group
  bool stand_in = false;                  // rehearsal: collectives are local copies
  // The shard group again, for the gradient reductions: on a GPU its own NCCL communicator, so
  // that reductions queue on their own stream beside the all-gathers (FSDP's and DeepSpeed's
  // separate reduce-scatter stream). nullptr: the shard group's.
  comm::Communicator* shard_reduce = nullptr;
};

// The groups of a real run made from its world (collective over it): the shard group of S
// consecutive ranks and the replica group of the ranks with the same index in theirs (HSDP,
// comm/groups.hpp); the world itself when S is the whole world.
struct OwnedGroups {
  std::unique_ptr<comm::Communicator> shard, replica, shard_reduce;
  EngineGroups groups;
};
// With separate_reduce_stream the shard group is split once more into shard_reduce.
OwnedGroups make_groups(comm::Communicator& world, const documents::ShardingSpec& spec,
                        bool separate_reduce_stream = false);

struct StepReport {
  std::int64_t step = 0;   // 1-based
  double loss = 0;         // mean over the global batch (this rank's alone in a rehearsal)
  double step_s = 0;       // wall time of the step on this rank
  double compute_s = 0;    // forward, backward and recompute
  double forward_s = 0;    // the forward of every micro-batch
  double backward_s = 0;   // the backward of every micro-batch (and its recompute)
  double optimizer_s = 0;  // AdamW over this rank's part
  double copy_s = 0;       // gradient copies into and out of buckets, accumulation adds
  // Time the compute waited for collectives it depends on (a GPU's compute stream, or the CPU's
  // computing thread with collective streams, stalled on the all-gather, reduce and replica
  // streams: the communication that did not overlap). 0 where collectives block the computing
  // thread: their time is in `collectives`.
  double comm_wait_s = 0;
  double gather_wait_s = 0;   // ... on the all-gathers' stream
  double reduce_wait_s = 0;   // ... on the reductions' stream
  double replica_wait_s = 0;  // ... on the replica all-reduce's stream (HSDP)
  // fp16-mixed: the loss scale the step's backward used, and whether its gradients overflowed
  // (the update was skipped and the scale halved). 1 and false otherwise.
  double loss_scale = 1;
  bool skipped = false;
  // This step's; where collectives run beside the compute (a GPU, collective streams on CPUs)
  // their time is the time to queue them, not to run them.
  CollectiveStats collectives;
  // CPU time of the computing thread over the step and over its compute parts: what the step
  // took while it ran. Wall time above CPU time is time the thread was not running (other load
  // on the machine; a collective that blocks instead of spinning).
  double step_cpu_s = 0;
  double compute_cpu_s = 0;
};

class ShardingEngine {
public:
  struct Impl;  // the engine for one compute type (engine.cpp)

  // Allocates this rank's parameters (initialised element by element, param_init.hpp) and
  // optimizer states, and the plan's persistent buffers. Throws OutOfMemory past the allocator's
  // capacity, std::invalid_argument for a spec or group the engine cannot run.
  ShardingEngine(EngineOptions options, TrackedAllocator& allocator, EngineGroups groups);
  ~ShardingEngine();
  ShardingEngine(const ShardingEngine&) = delete;
  ShardingEngine& operator=(const ShardingEngine&) = delete;

  // One optimizer step: every micro-batch's forward and backward, the reductions, AdamW, the
  // parameter all-gathers. Collective over the world.
  StepReport step();

  // Collective over the shard group: unit u's full parameters (size elements; the fp32 master
  // weights under mixed precision), on every rank, in host memory.
  std::vector<float> full_parameters(std::int64_t unit);

  const GptLayout& layout() const;
  const ShardLayout& shards() const;
  const EngineOptions& options() const;
  std::int64_t steps_done() const;

  // This rank's resident state of a unit, for checkpoints (checkpoint.hpp). Each span holds the
  // elements [begin, begin + size) of the unit's flat buffer, zero padding past the unit's size
  // included: the parameters (the chunk when partitioned, else whole) and AdamW's moments (the
  // chunk under a sharded optimizer, else whole). Valid between steps; host memory only (the CPU
  // backend's); fp32 only (std::logic_error under mixed precision).
  struct UnitState {
    std::span<float> params;
    std::int64_t params_begin = 0;
    std::span<float> exp_avg, exp_avg_sq;
    std::int64_t optimizer_begin = 0;
  };
  UnitState unit_state(std::int64_t unit);
  // Continues from a checkpoint taken after `steps` steps: the next step is steps + 1, for the
  // AdamW bias corrections and the synthetic data stream alike.
  void set_steps_done(std::int64_t steps);
  // Units whose gathers the engine issues ahead of use (0 on a blocking backend, see above).
  int forward_prefetch() const;
  int backward_prefetch() const;

private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardplan::executor
