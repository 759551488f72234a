// Gradient buffers, buckets and reductions (engine.hpp), as Megatron-core's
// param_and_grad_buffer keeps them for its DDP wrapper:
//
//   targets     the buffer a unit's backward adds its gradient into: the kept whole gradient
//               (fp32 or S), or an S buffer of one micro-batch (sharded gradients; fp32 whole
//               gradients widen it after the backward)
//   reductions  reduce-scatter into a kept chunk (sharded gradients: accumulated over
//               micro-batches, widened into fp32 one unit late), reduce-scatter into this rank's
//               chunk of the whole gradient (ZeRO-1), or all-reduce in reduce_bucket_bytes
//               pieces (DDP); then the replica all-reduce (HSDP)
//   buckets     DDP's bucket copy (grad_bucket_copy) and DeepSpeed's contiguous buckets (one,
//               two with flat_grad_partition), allocated with the engine, kept for the run
//
// Streams: every reduction waits for the compute that wrote its input (ready_for_reduce); the
// compute waits for the reductions (and the replica all-reduce) before it reads or overwrites
// what they wrote; a buffer freed while a reduction may still read it is recorded as used by
// the reduce stream.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "executor/engine_state.hpp"
#include "kernels/scalar.hpp"

namespace shardplan::executor {

// Elements of one DDP all-reduce bucket: reduce_bucket_bytes counted in the reduce dtype (at
// least one element); the whole unit without buckets.
std::int64_t all_reduce_bucket_elements(const documents::ShardingSpec& spec,
                                        std::int64_t unit_elements);

// Where each unit's region starts in DDP's bucket copy (whole elements, units in order), and
// the total as the last entry.
std::vector<std::int64_t> bucket_copy_offsets(const ShardLayout& shards,
                                              const documents::ShardingSpec& spec);

template <class S> class GradBuffers {
public:
  // Allocates the buckets the spec asks for (`buffers`).
  explicit GradBuffers(EngineState<S>& state);

  // Before unit u's backward: its gradient target exists.
  void ensure_target(std::int64_t u);
  // The S buffer the model adds unit u's gradient into (empty for fp32 whole gradients under
  // mixed precision: the model writes micro_batch_grads then).
  std::span<S> target(std::int64_t u);
  // After unit u's backward: the S gradient the model wrote, widened into the fp32 whole
  // gradient. A tied head also added into the embedding's transient, widened after the
  // embedding's backward.
  void widen_whole(std::int64_t u);
  // After unit u's backward, on a micro-batch that reduces.
  void reduce_unit(std::int64_t u);
  // The reduced S chunks of earlier units into their fp32 chunks. Queued on the compute stream
  // one unit late, so that a unit's reduce-scatter overlaps the next unit's backward.
  void widen_reduced();
  // The reductions are done before the compute reads what they wrote.
  void wait_for_reductions();
  // grad_bucket_copy without a sharded optimizer: the all-reduced sums back into the gradients
  // (a reduce-scatter wrote its chunk in place otherwise). After wait_for_reductions: the
  // all-reduces write the bucket in place on their own stream.
  void copy_back_buckets();
  // zero_grad(set_to_none=True): the gradients kept through the step are released.
  void release_step_gradients();

private:
  using A = typename EngineState<S>::A;
  using Part = typename EngineState<S>::Part;
  static constexpr bool kMixed = EngineState<S>::kMixed;

  // A unit's gradient copied into the current contiguous bucket, not yet reduced.
  struct BucketEntry {
    std::int64_t unit;
    std::int64_t offset;  // elements into the bucket
  };
  // A reduced chunk in S waiting to be added into the unit's fp32 chunk.
  struct PendingWiden {
    std::int64_t unit;
    TrackedBuffer<S> chunk;  // [chunk]
  };

  bool widens_whole() const;
  void reduce_into_contiguous_bucket(std::int64_t u, S* source, std::int64_t elements);
  void reduce_whole_fp32(std::int64_t u);
  void release_micro_batch_grads(UnitBuffers<S>& buffers);
  void accumulate_into_input(std::int64_t u, S* input, const S* kept_chunk);
  void ready_for_reduce();
  void wait_for_bucket();
  void flush_bucket();
  template <class T> void reduce_from(std::int64_t u, T* input);
  void reduce_scatter_sharded(std::int64_t u, S* input);
  template <class T> void reduce_into_chunk(std::int64_t u, T* input, T* out);
  template <class T> void reduce_scatter_whole(std::int64_t u, T* input);
  template <class T> void all_reduce_in_buckets(std::int64_t u, T* input);
  template <class T> TrackedBuffer<T> reduce_output(MemoryCategory category, std::int64_t elements);
  template <class T> void replica_all_reduce(T* data, std::size_t count);
  template <class T> T* whole_grad_data(std::int64_t u);
  template <class T> void copy_elements(T* dst, const T* src, std::int64_t n);

  EngineState<S>& state_;
  TrackedBuffer<A> bucket_copy_;  // grad_bucket_copy: every unit's gradient, concatenated
  std::vector<std::int64_t> bucket_copy_offsets_;  // per unit, elements into bucket_copy_
  TrackedBuffer<S> bucket_;        // contiguous_grad_bucket [reduce_bucket_bytes / S]
  bool bucket_in_flight_ = false;  // reduced from and not waited for since
  std::int64_t bucket_used_ = 0;   // elements of it
  double bucket_bytes_ = 0;        // the cost model's count: elements × reduce dtype bytes
  std::vector<BucketEntry> bucket_entries_;
  std::vector<PendingWiden> pending_widens_;
};

extern template class GradBuffers<float>;
extern template class GradBuffers<kernels::bf16>;
extern template class GradBuffers<kernels::f16>;

}  // namespace shardplan::executor
