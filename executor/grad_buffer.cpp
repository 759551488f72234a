#include "executor/grad_buffer.hpp"
#include "kernels/scalar.hpp"

#include <algorithm>
#include <stdexcept>

namespace shardplan::executor {

using kernels::bf16;
using kernels::data_type_v;
using kernels::f16;

std::int64_t all_reduce_bucket_elements(const documents::ShardingSpec& spec,
                                        std::int64_t unit_elements) {
  if (!(spec.reduce_bucket_bytes > 0)) return unit_elements;
  const double dtype = documents::dtype_bytes(spec.reduce_dtype);
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(spec.reduce_bucket_bytes / dtype));
}

std::vector<std::int64_t> bucket_copy_offsets(const ShardLayout& shards,
                                              const documents::ShardingSpec& spec) {
  std::vector<std::int64_t> offsets;
  std::int64_t total = 0;
  for (std::int64_t u = 0; u < static_cast<std::int64_t>(shards.units.size()); ++u) {
    offsets.push_back(total);
    total += shards.whole_elements(u, spec);
  }
  offsets.push_back(total);
  return offsets;
}

template <class S> GradBuffers<S>::GradBuffers(EngineState<S>& state) : state_(state) {
  const auto& spec = state.spec();
  if (spec.grad_bucket_copy) {
    bucket_copy_offsets_ = bucket_copy_offsets(state.shards, spec);
    bucket_copy_ =
        state.allocator.template allocate<A>(MemoryCategory::buffers, bucket_copy_offsets_.back());
  }
  if (spec.contiguous_grad_bucket) {
    // One bucket in every stage, as DeepSpeed 0.19.8 keeps one per dtype (stage 3 included:
    // measured, tests/costmodel/data/oracle_deepspeed_executor.json); it is refilled once its
    // last reduction is done.
    const auto elements = static_cast<std::int64_t>(spec.reduce_bucket_bytes / sizeof(S));
    bucket_ = state.allocator.template allocate<S>(MemoryCategory::buffers, elements);
  }
}

// The model adds a unit's gradient into an S buffer: the kept whole gradient when it is S, else
// micro_batch_grads (sharded gradients' per-micro-batch gradient, or the transient widened into
// fp32 whole gradients).
template <class S> bool GradBuffers<S>::widens_whole() const {
  return kMixed && !state_.spec().shard_gradients && !state_.low_whole();
}

template <class S> void GradBuffers<S>::ensure_target(std::int64_t u) {
  auto& st = state_;
  auto& buffers = st.unit(u);
  if (st.spec().shard_gradients) {
    if (buffers.micro_batch_grads.empty())
      buffers.micro_batch_grads =
          st.allocator.template allocate<S>(MemoryCategory::gradients, st.shape(u).padded);
    return;
  }
  const std::int64_t n = st.shards.whole_elements(u, st.spec());
  if (st.low_whole()) {
    if (buffers.low_whole_grads.empty())
      buffers.low_whole_grads = st.allocator.template allocate<S>(MemoryCategory::gradients, n);
    return;
  }
  if (buffers.whole_grads.empty())
    buffers.whole_grads = st.allocator.template allocate<A>(MemoryCategory::gradients, n);
  if (widens_whole() && buffers.micro_batch_grads.empty())
    buffers.micro_batch_grads = st.allocator.template allocate<S>(MemoryCategory::gradients, n);
}

template <class S> std::span<S> GradBuffers<S>::target(std::int64_t u) {
  auto& buffers = state_.unit(u);
  if (state_.spec().shard_gradients || widens_whole()) return buffers.micro_batch_grads.span();
  if (state_.low_whole()) return buffers.low_whole_grads.span();
  if constexpr (kMixed)
    return {};
  else
    return buffers.whole_grads.span();
}

template <class S> void GradBuffers<S>::widen_whole(std::int64_t u) {
  if (!widens_whole()) return;
  auto& buffers = state_.unit(u);
  state_.timed(Part::copy, [&] {
    state_.backend.widen_add(buffers.whole_grads.data(), buffers.micro_batch_grads.data(),
                             buffers.micro_batch_grads.size());
  });
  buffers.micro_batch_grads.reset();
}

// Adds the kept chunk into this rank's block of the reduce input, so that the reduce-scatter's
// sum is the accumulated gradient (the reduce overwrites its output). With replicas only the
// first replica adds it: the replica all-reduce then sums it once. On every replica the
// reduce-scatter about to overwrite the kept chunk waits for the previous micro-batch's replica
// all-reduce of it (write after write across the two streams).
template <class S>
void GradBuffers<S>::accumulate_into_input(std::int64_t u, S* input, const S* kept_chunk) {
  auto& st = state_;
  auto* reduce = st.streams.reduce.get();
  auto* replica = st.streams.replica.get();
  if (replica) st.backend.wait(reduce, replica);
  if (st.shards.replica_rank != 0) return;
  st.backend.wait(nullptr, reduce);  // the kept chunk is the previous micro-batch's reduction
  if (replica) st.backend.wait(nullptr, replica);
  st.timed(Part::copy, [&] {
    st.backend.add(input + st.shards.chunk_begin(u), kept_chunk, st.shape(u).chunk);
  });
}

// Before a reduction reads its input: the compute that wrote it is done. (A buffer freed before
// the step's end that a reduction read, the per-micro-batch gradient, is marked as used by the
// reduce stream where it is freed, release_micro_batch_grads; the others live until the step's
// end, when every stream has been waited for.)
template <class S> void GradBuffers<S>::ready_for_reduce() {
  state_.backend.wait(state_.streams.reduce.get(), nullptr);
}

// A reduction's output that the compute stream reads later.
template <class S>
template <class T>
TrackedBuffer<T> GradBuffers<S>::reduce_output(MemoryCategory category, std::int64_t elements) {
  auto& st = state_;
  st.backend.allocate_on(st.streams.reduce.get());
  auto out = st.allocator.template allocate<T>(category, elements);
  st.backend.allocate_on(nullptr);
  st.backend.record_use(out.data(), nullptr);
  if (st.streams.replica) st.backend.record_use(out.data(), st.streams.replica.get());
  return out;
}

// The replica group's all-reduce of what the shard group's reduction produced.
template <class S>
template <class T>
void GradBuffers<S>::replica_all_reduce(T* data, std::size_t count) {
  auto* replica = state_.streams.replica.get();
  if (!replica) return;
  state_.backend.wait(replica, state_.streams.reduce.get());
  replica->all_reduce(data, data, count, data_type_v<T>);
}

template <class S> void GradBuffers<S>::widen_reduced() {
  if (pending_widens_.empty()) return;
  auto& st = state_;
  st.backend.wait(nullptr, st.streams.reduce.get());
  if (st.streams.replica) st.backend.wait(nullptr, st.streams.replica.get());
  for (auto& w : pending_widens_) {
    auto& buffers = st.unit(w.unit);
    st.timed(Part::copy, [&] {
      st.backend.widen_add(buffers.grad_chunk.data(), w.chunk.data(), w.chunk.size());
    });
  }
  pending_widens_.clear();
}

// Reduces unit u's gradient held in `input` (padded elements when the optimizer is sharded,
// whole otherwise). `input` may be the unit's own gradient buffer or a bucket region.
template <class S> template <class T> void GradBuffers<S>::reduce_from(std::int64_t u, T* input) {
  const auto& spec = state_.spec();
  if (spec.shard_optimizer && spec.shard_gradients) {
    if constexpr (std::is_same_v<T, S>)
      reduce_scatter_sharded(u, input);
    else
      throw std::logic_error("sharded gradients are computed in the compute type");
  } else if (spec.shard_optimizer) {
    reduce_scatter_whole(u, input);
  } else {
    all_reduce_in_buckets(u, input);
  }
}

// Sharded gradients: reduced into the kept chunk, accumulated over micro-batches.
template <class S> void GradBuffers<S>::reduce_scatter_sharded(std::int64_t u, S* input) {
  auto& st = state_;
  const auto& us = st.shape(u);
  auto& buffers = st.unit(u);
  if ((kMixed && !st.policy.low_kept_chunk) || st.offload.optimizer) {
    // S reduce-scatter, added into the fp32 chunk (FSDP's sharded gradient; DeepSpeed stage 3's
    // fp32 partition).
    if (buffers.grad_chunk.empty())
      buffers.grad_chunk =
          st.optimizer_allocator().template allocate<A>(MemoryCategory::gradients, us.chunk);
    auto out = reduce_output<S>(MemoryCategory::gradients, us.chunk);
    reduce_into_chunk(u, input, out.data());
    pending_widens_.push_back({u, std::move(out)});
    if (st.offload.optimizer)
      widen_reduced();  // device → host now: the device keeps no chunk (the cost model's)
    return;
  }
  auto& kept = [&]() -> TrackedBuffer<S>& {
    if constexpr (kMixed)
      return buffers.low_grad_chunk;
    else
      return buffers.grad_chunk;
  }();
  if (kept.empty())
    kept = reduce_output<S>(MemoryCategory::gradients, us.chunk);
  else
    accumulate_into_input(u, input, kept.data());
  reduce_into_chunk(u, input, kept.data());
}

// This rank's chunk of the sum of unit u's gradients, into `out`: a reduce-scatter (then HSDP's
// replica all-reduce), or, as DeepSpeed runs ZeRO-1/2 (all_reduce_partitions), an all-reduce of
// the whole padded unit in place in `input`, of which the rank keeps its chunk: copied into `out`
// once the compute stream has waited for the reduction (DeepSpeed copies on its reduction stream).
template <class S>
template <class T>
void GradBuffers<S>::reduce_into_chunk(std::int64_t u, T* input, T* out) {
  auto& st = state_;
  const auto& us = st.shape(u);
  const auto chunk = static_cast<std::size_t>(us.chunk);
  ready_for_reduce();
  if (!st.spec().all_reduce_partitions) {
    st.streams.reduce->reduce_scatter(input, out, chunk, data_type_v<T>);
    replica_all_reduce(out, chunk);
    return;
  }
  st.streams.reduce->all_reduce(input, input, static_cast<std::size_t>(us.padded), data_type_v<T>);
  const T* sum = input + st.shards.chunk_begin(u);
  if (sum == out) return;
  st.backend.wait(nullptr, st.streams.reduce.get());
  st.timed(Part::copy, [&] { copy_elements(out, sum, us.chunk); });
}

// Whole gradients, sharded optimizer (ZeRO-1): this rank's chunk of the whole buffer gets the
// reduced chunk. The output must not overlap the input: a bucket region, or a transient.
template <class S>
template <class T>
void GradBuffers<S>::reduce_scatter_whole(std::int64_t u, T* input) {
  auto& st = state_;
  const auto& us = st.shape(u);
  auto* reduce = st.streams.reduce.get();
  const auto chunk = static_cast<std::size_t>(us.chunk);
  T* whole = whole_grad_data<T>(u);
  T* mine = whole + st.shards.chunk_begin(u);
  if (input != whole || st.spec().all_reduce_partitions) {
    reduce_into_chunk(u, input, mine);
  } else {
    ready_for_reduce();
    auto out = reduce_output<T>(MemoryCategory::buffers, us.chunk);
    reduce->reduce_scatter(input, out.data(), chunk, data_type_v<T>);
    replica_all_reduce(out.data(), chunk);
    st.backend.wait(nullptr, st.streams.replica ? st.streams.replica.get() : reduce);
    st.timed(Part::copy, [&] { copy_elements(mine, out.data(), us.chunk); });
  }
}

// All-reduce in buckets of reduce_bucket_bytes (DDP's bucket_cap_mb; the cost model's
// bucketed(): one collective per full bucket and one for the rest).
template <class S>
template <class T>
void GradBuffers<S>::all_reduce_in_buckets(std::int64_t u, T* input) {
  const auto& us = state_.shape(u);
  const std::int64_t per = all_reduce_bucket_elements(state_.spec(), us.size);
  ready_for_reduce();
  for (std::int64_t begin = 0; begin < us.size; begin += per) {
    const auto n = static_cast<std::size_t>(std::min(per, us.size - begin));
    state_.streams.reduce->all_reduce(input + begin, input + begin, n, data_type_v<T>);
    replica_all_reduce(input + begin, n);
  }
}

// The kept whole gradient of unit u as T: fp32 (PyTorch's, and every fp32 run's) or S
// (DeepSpeed ZeRO-1's).
template <class S> template <class T> T* GradBuffers<S>::whole_grad_data(std::int64_t u) {
  auto& buffers = state_.unit(u);
  if constexpr (!kMixed)
    return buffers.whole_grads.data();
  else if constexpr (std::is_same_v<T, S>)
    return state_.low_whole() ? buffers.low_whole_grads.data()
                              : throw std::logic_error("fp32 whole gradients");
  else
    return state_.low_whole() ? throw std::logic_error("16-bit whole gradients")
                              : buffers.whole_grads.data();
}

// The compute stream's copy of n elements of either type.
template <class S>
template <class T>
void GradBuffers<S>::copy_elements(T* dst, const T* src, std::int64_t n) {
  if constexpr (std::is_same_v<T, S>)
    state_.backend.copy(dst, src, n);
  else
    state_.backend.copy_wide(dst, src, n);
}

// Waits until the last reductions that read the bucket are done, before it is filled again.
template <class S> void GradBuffers<S>::wait_for_bucket() {
  if (!bucket_in_flight_) return;
  state_.backend.wait(nullptr, state_.streams.reduce.get());
  if (state_.streams.replica) state_.backend.wait(nullptr, state_.streams.replica.get());
  bucket_in_flight_ = false;
}

template <class S> void GradBuffers<S>::flush_bucket() {
  for (const auto& entry : bucket_entries_)
    reduce_from<S>(entry.unit, bucket_.data() + entry.offset);
  if (!bucket_entries_.empty()) bucket_in_flight_ = true;  // an empty flush leaves it as it was
  if (!state_.spec().shard_optimizer) {  // all-reduced in the bucket: copy the sums back
    wait_for_bucket();
    for (const auto& entry : bucket_entries_)
      state_.timed(Part::copy, [&] {
        state_.backend.copy(whole_grad_data<S>(entry.unit), bucket_.data() + entry.offset,
                            state_.shape(entry.unit).size);
      });
  }
  bucket_entries_.clear();
  bucket_used_ = 0;
  bucket_bytes_ = 0;
}

template <class S> void GradBuffers<S>::reduce_unit(std::int64_t u) {
  auto& st = state_;
  const auto& spec = st.spec();
  auto& buffers = st.unit(u);
  widen_reduced();
  if (!spec.shard_gradients && !st.low_whole() && kMixed) {
    // fp32 whole gradients (DDP): all-reduced in fp32.
    reduce_whole_fp32(u);
    return;
  }
  S* source = spec.shard_gradients ? buffers.micro_batch_grads.data() : whole_grad_data<S>(u);
  const std::int64_t elements =
      spec.shard_gradients ? st.shape(u).padded : st.shards.whole_elements(u, spec);
  if (spec.contiguous_grad_bucket) {
    reduce_into_contiguous_bucket(u, source, elements);
    return;
  }
  if (spec.grad_bucket_copy) {
    // torch DDP without gradient_as_bucket_view: gradients are copied into the bucket, reduced
    // there, and the reduced values copied back into the gradients. The copies back come after
    // the backward (copy_back_buckets), once the compute stream has waited for every reduction,
    // so that it does not wait for each bucket's reduction in turn.
    if constexpr (!kMixed) {  // fp32 (mixed precision: reduce_whole_fp32)
      A* region = bucket_copy_.data() + bucket_copy_offsets_[static_cast<std::size_t>(u)];
      st.timed(Part::copy, [&] { st.backend.copy(region, source, st.shape(u).size); });
      reduce_from<S>(u, region);
    }
  } else {
    reduce_from<S>(u, source);
  }
  release_micro_batch_grads(buffers);
}

// DeepSpeed's contiguous gradients: the unit's gradient is copied into the bucket and its own
// buffer freed; the bucket is reduced when it holds reduce_bucket_bytes (counted in the reduce
// dtype, as the cost model counts) or at the first unit. A unit larger than the whole bucket is
// reduced from its own buffer.
template <class S>
void GradBuffers<S>::reduce_into_contiguous_bucket(std::int64_t u, S* source,
                                                   std::int64_t elements) {
  auto& st = state_;
  const auto& spec = st.spec();
  const std::int64_t capacity = bucket_.size();
  if (elements > capacity) {
    flush_bucket();
    reduce_from<S>(u, source);
  } else {
    if (bucket_used_ + elements > capacity) flush_bucket();
    wait_for_bucket();
    st.timed(Part::copy, [&] { st.backend.copy(bucket_.data() + bucket_used_, source, elements); });
    bucket_entries_.push_back({u, bucket_used_});
    bucket_used_ += elements;
    bucket_bytes_ +=
        static_cast<double>(st.shape(u).size) * documents::dtype_bytes(spec.reduce_dtype);
  }
  release_micro_batch_grads(st.unit(u));
  if (!bucket_entries_.empty() && (bucket_bytes_ >= spec.reduce_bucket_bytes || u == 0))
    flush_bucket();
}

// DDP under mixed precision: the fp32 gradient, all-reduced in fp32 from the bucket copy or in
// place.
template <class S> void GradBuffers<S>::reduce_whole_fp32(std::int64_t u) {
  auto& st = state_;
  if (st.spec().grad_bucket_copy) {
    A* region = bucket_copy_.data() + bucket_copy_offsets_[static_cast<std::size_t>(u)];
    st.timed(Part::copy, [&] {
      st.backend.copy_wide(region, st.unit(u).whole_grads.data(), st.shape(u).size);
    });
    reduce_from<A>(u, region);
    return;
  }
  reduce_from<A>(u, st.unit(u).whole_grads.data());
}

// Frees a unit's per-micro-batch gradient (sharded gradients), which a reduction may still be
// reading on its stream: the memory is not handed out again before that is done.
template <class S> void GradBuffers<S>::release_micro_batch_grads(UnitBuffers<S>& buffers) {
  if (buffers.micro_batch_grads.empty()) return;
  state_.backend.record_use(buffers.micro_batch_grads.data(), state_.streams.reduce.get());
  buffers.micro_batch_grads.reset();
}

template <class S> void GradBuffers<S>::wait_for_reductions() {
  state_.backend.wait(nullptr, state_.streams.reduce.get());
  if (state_.streams.replica) state_.backend.wait(nullptr, state_.streams.replica.get());
}

template <class S> void GradBuffers<S>::copy_back_buckets() {
  const auto& spec = state_.spec();
  if (!spec.grad_bucket_copy || spec.shard_optimizer) return;
  for (std::int64_t u = 0; u < state_.unit_count(); ++u)
    state_.timed(Part::copy, [&] {
      copy_elements<A>(state_.unit(u).whole_grads.data(),
                       bucket_copy_.data() + bucket_copy_offsets_[static_cast<std::size_t>(u)],
                       state_.shape(u).size);
    });
}

template <class S> void GradBuffers<S>::release_step_gradients() {
  for (auto& buffers : state_.units) {
    buffers.whole_grads.reset();
    buffers.low_whole_grads.reset();
    buffers.grad_chunk.reset();
    buffers.low_grad_chunk.reset();
  }
}

template class GradBuffers<float>;
template class GradBuffers<bf16>;
template class GradBuffers<f16>;

}  // namespace shardplan::executor
