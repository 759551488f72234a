// What the parts of the sharding engine share (engine.hpp): the options, the allocators, the
// backend, the shard layout, the collective streams and every unit's buffers. The parts that act
// on them each hold a reference to one EngineState:
//
//   gather_scheduler.hpp   gathers, autocast copies and prefetch of the parameters a unit runs on
//   grad_buffer.hpp        gradient buffers, buckets and the reductions
//   optimizer_step.hpp     AdamW over this rank's part, with the fp16 loss scaler (loss_scaler.hpp)
//   engine.cpp             the step loop that orders them
//
// S is the compute type; A = accum_t<S> the type of the master weights, the optimizer states and
// the fp32 gradients (S itself under fp32).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "executor/engine.hpp"
#include "executor/host_offload.hpp"
#include "executor/timed_communicator.hpp"
#include "kernels/backend.hpp"
#include "kernels/scalar.hpp"

namespace shardplan::executor {

// CPU time of the calling thread (POSIX CLOCK_THREAD_CPUTIME_ID), seconds.
double thread_cpu_seconds();

// Throws std::invalid_argument for options the engine does not run, whatever the groups: a spec
// no framework runs, no micro-batch, no world group.
void check_engine_options(const EngineOptions& options, const EngineGroups& groups);

// What the watchdog is told the step does: "step 2 forward unit 3" ("step 2 micro-batch 1
// forward unit 3" with gradient accumulation). unit < 0: none; micro_batch < 0: none.
std::string phase_text(std::int64_t step, std::int64_t grad_accumulation, const char* part,
                       std::int64_t unit, std::int64_t micro_batch);

// One unit's buffers. Sizes in elements: `whole` is the unit's size (or whole_elements), `chunk`
// and `padded` are its shard layout's (shard_layout.hpp).
template <class S> struct UnitBuffers {
  using A = kernels::accum_t<S>;
  TrackedBuffer<A> params;      // fp32 parameters at rest [chunk or whole]; DeepSpeed: the master
  TrackedBuffer<S> low_params;  // DeepSpeed's S parameters at rest [chunk or whole]
  TrackedBuffer<A> exp_avg;     // AdamW's first moment [chunk (sharded optimizer) or whole]
  TrackedBuffer<A> exp_avg_sq;  // ... second moment, the same shape
  // Whole gradient (unsharded gradients) [whole], alive from first use to the step's end, fp32
  // or S (DeepSpeed ZeRO-1).
  TrackedBuffer<A> whole_grads;
  TrackedBuffer<S> low_whole_grads;
  // S gradient of one micro-batch: sharded gradients' full gradient [padded]; with fp32 whole
  // gradients the unit's backward output [whole], widened into them after the backward.
  TrackedBuffer<S> micro_batch_grads;
  TrackedBuffer<A> grad_chunk;      // reduced chunk (sharded gradients) [chunk], fp32 or
  TrackedBuffer<S> low_grad_chunk;  // ... S: from its first reduce to the step's end
  TrackedBuffer<S> gathered;        // all-gathered parameters [padded], or DDP's S copy [whole]
  // Optimizer offload where the device keeps the fp32 parameters (PyTorch's flavours, fp32):
  // the host's fp32 copy of this rank's part of them [chunk or whole], AdamW's master
  // (host_offload.hpp).
  TrackedBuffer<A> host_master;
};

// The collective streams: the shard group's all-gathers, its reductions (the same group, on a
// GPU its own stream) and the replica group's all-reduce (HSDP; null with a single group). Each
// counts its collectives in the step's CollectiveStats.
struct EngineStreams {
  std::unique_ptr<TimedCommunicator> gather, reduce, replica;
};

template <class S> struct EngineState {
  using A = kernels::accum_t<S>;
  using Part = typename kernels::Backend<S>::Part;
  static constexpr bool kMixed = !std::is_same_v<S, A>;
  static constexpr comm::DataType kS = kernels::data_type_v<S>;
  static constexpr comm::DataType kA = kernels::data_type_v<A>;

  // Checks the options and groups and allocates the state present before the first step:
  // parameters and optimizer states (the buffers of the parts are theirs).
  EngineState(EngineOptions options, TrackedAllocator& allocator, EngineGroups groups);

  EngineOptions options;
  TrackedAllocator& allocator;  // the device's
  EngineGroups groups;
  std::unique_ptr<kernels::Backend<S>> host_backend;  // when the options name none
  kernels::Backend<S>& backend;
  GptModel<S> model;
  PrecisionPolicy policy;
  ShardLayout shards;
  CollectiveStats stats;  // of the current step
  EngineStreams streams;
  // Offloaded states (host_offload.hpp): a pool of its own, not the device's; declared before the
  // units so that it outlives their buffers.
  OffloadPolicy offload;
  TrackedAllocator host_pool;
  std::vector<UnitBuffers<S>> units;
  std::int64_t step_count = 0;    // steps begun, the current one included (1-based)
  double compute_cpu_s = 0;       // of the current step's compute, seconds
  double initial_loss_scale = 1;  // fp16-mixed: the options', checked; 1 otherwise

  std::int64_t unit_count() const { return static_cast<std::int64_t>(units.size()); }
  const UnitShards& shape(std::int64_t u) const {
    return shards.units[static_cast<std::size_t>(u)];
  }
  UnitBuffers<S>& unit(std::int64_t u) { return units[static_cast<std::size_t>(u)]; }
  bool tied() const { return options.model.tied_embeddings; }
  bool is_head(std::int64_t u) const { return u == unit_count() - 1; }
  int world_rank() const { return shards.replica_rank * shards.group + shards.shard_rank; }
  bool low_whole() const { return policy.low_whole_grads; }
  const documents::ShardingSpec& spec() const { return options.spec; }
  // The allocator offloaded states live in: the host pool under optimizer offload.
  TrackedAllocator& optimizer_allocator() { return offload.optimizer ? host_pool : allocator; }

  // Tells the watchdog what the step does now (phase_text). Units are whole blocks: the
  // formatting is noise.
  void phase(const char* part, std::int64_t u = -1, std::int64_t micro_batch = -1) {
    if (options.watchdog != nullptr)
      options.watchdog->set_phase(
          phase_text(step_count, options.grad_accumulation, part, u, micro_batch));
  }
  // f() timed as the backend's part (its stream's time on a GPU).
  template <class F> void timed(Part part, F&& f) {
    backend.begin(part);
    f();
    backend.end(part);
  }
  // ... and its CPU time added to compute_cpu_s.
  template <class F> void timed_compute(Part part, F&& f) {
    const double start = thread_cpu_seconds();
    timed(part, f);
    compute_cpu_s += thread_cpu_seconds() - start;
  }

private:
  void set_policy();
  void make_streams();
  void allocate_parameters();
  void allocate_optimizer_states();
  // Parameters drawn on the host (param_init.hpp) as fp32, written into `out` as T: unit u's
  // elements from `first`.
  template <class T> void write_initial(TrackedBuffer<T>& out, std::int64_t u, std::int64_t first);
};

extern template struct EngineState<float>;
extern template struct EngineState<kernels::bf16>;
extern template struct EngineState<kernels::f16>;

}  // namespace shardplan::executor
