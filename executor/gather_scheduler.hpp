// The parameters a unit computes on, and when they are gathered (engine.hpp): the all-gathers of
// partitioned parameters (cast to S first under FSDP's mixed precision; from the host pool under
// parameter offload), DDP's autocast copies, the tied head's second gather of the embedding,
// their release, the prefetch ahead of use that the plan asks for, and the all-gather of the
// updated parameters after a sharded optimizer's step.
//
// Streams: a gathered buffer is written by the all-gather stream and read by the compute stream,
// which waits for it (wait_for_gathers) before the unit's compute.
#pragma once

#include <cstdint>
#include <span>

#include "executor/engine_state.hpp"
#include "kernels/scalar.hpp"

namespace shardplan::executor {

// The cost model's kept_through_backward (costmodel/simulator.cpp): without resharding every
// gathered unit stays for the backward; with it the last unit (the head), and FSDP1's root, stay.
bool kept_through_backward(const documents::ShardingSpec& spec, std::int64_t unit,
                           std::int64_t unit_count);

// How many units ahead the engine issues gathers (EngineOptions::prefetch_as_planned): none
// unless the plan prefetches partitioned parameters; DeepSpeed's forward depth is as many blocks
// as stage3_prefetch_bucket_size elements hold (at least one), as the cost model derives it.
struct PrefetchDepth {
  int forward = 0;
  int backward = 0;
};
PrefetchDepth prefetch_depth(const documents::ShardingSpec& spec, bool prefetch_as_planned,
                             std::int64_t block_elements);

template <class S> class GatherScheduler {
public:
  explicit GatherScheduler(EngineState<S>& state);

  // A unit needs a gather before it runs: its parameters are partitioned, or it is a tied head
  // whose output matrix lives in the partitioned embedding unit (the cost model's head gather
  // includes the embedding matrix).
  bool needs_gather(std::int64_t u) const;
  // DDP under autocast: the unit computes from an S copy of its fp32 parameters.
  bool needs_copy(std::int64_t u) const;
  bool kept(std::int64_t u) const;

  // Unit u's parameters for its compute, gathered or copied unless they are already. The
  // embedding's backward reads none: DDP's S copy of it exists for the forward only (the cost
  // model counts none: autocast does not cast the lookup).
  void acquire(std::int64_t u, bool backward = false);
  void release(std::int64_t u);
  // Before unit u's compute: the gathers queued so far (u's among them; later prefetches are
  // queued after this) are done.
  void wait_for_gathers(std::int64_t u);
  // Plan-order prefetch: the next units (forward) or previous ones (backward) the rate limiter
  // (max_inflight_allgathers) allows.
  void prefetch_forward(std::int64_t u);
  void prefetch_backward(std::int64_t u);

  std::span<const S> params_for(std::int64_t u);
  std::span<const S> embedding_for_head();  // empty when the head is not tied

  // Sharded optimizer, parameters not partitioned (ZeRO-1/2, and units kept whole under ZeRO-3's
  // persistence threshold): every rank all-gathers the updated chunks in place.
  void gather_updated_parameters();

  PrefetchDepth depth() const { return depth_; }

private:
  using A = typename EngineState<S>::A;
  using Part = typename EngineState<S>::Part;
  static constexpr bool kMixed = EngineState<S>::kMixed;

  bool alive(std::int64_t u);
  void gather_into(std::int64_t u, TrackedBuffer<S>& out);
  void gather_offloaded(std::int64_t u, TrackedBuffer<S>& out);
  void copy_into(std::int64_t u, TrackedBuffer<S>& out);

  EngineState<S>& state_;
  PrefetchDepth depth_;
  TrackedBuffer<S> head_embedding_;  // tied head: the embedding gathered (or copied) again [padded]
};

extern template class GatherScheduler<float>;
extern template class GatherScheduler<kernels::bf16>;
extern template class GatherScheduler<kernels::f16>;

}  // namespace shardplan::executor
