#include "executor/gather_scheduler.hpp"
#include "kernels/scalar.hpp"

#include <algorithm>

namespace shardplan::executor {

using kernels::bf16;
using kernels::f16;

bool kept_through_backward(const documents::ShardingSpec& spec, std::int64_t unit,
                           std::int64_t unit_count) {
  return !spec.reshard_after_forward || unit == unit_count - 1 ||
         (spec.keep_root_unsharded && unit == 0);
}

PrefetchDepth prefetch_depth(const documents::ShardingSpec& spec, bool prefetch_as_planned,
                             std::int64_t block_elements) {
  PrefetchDepth depth;
  if (!prefetch_as_planned || !spec.shard_parameters) return depth;
  depth.forward = spec.forward_prefetch;
  depth.backward = spec.backward_prefetch;
  const double block = static_cast<double>(block_elements);
  if (spec.prefetch_bucket_elems > 0 && block > 0)
    depth.forward = std::max(1, static_cast<int>(spec.prefetch_bucket_elems / block));
  return depth;
}

template <class S>
GatherScheduler<S>::GatherScheduler(EngineState<S>& state)
    : state_(state), depth_(prefetch_depth(state.spec(), state.options.prefetch_as_planned,
                                           state.model.layout().block().size)) {}

template <class S> bool GatherScheduler<S>::needs_gather(std::int64_t u) const {
  return state_.shape(u).params_sharded ||
         (state_.is_head(u) && state_.tied() && state_.shape(0).params_sharded);
}

template <class S> bool GatherScheduler<S>::needs_copy(std::int64_t u) const {
  return state_.policy.autocast_copies && !needs_gather(u);
}

template <class S> bool GatherScheduler<S>::kept(std::int64_t u) const {
  return kept_through_backward(state_.spec(), u, state_.unit_count());
}

template <class S> bool GatherScheduler<S>::alive(std::int64_t u) {
  return !state_.unit(u).gathered.empty() || (state_.is_head(u) && !head_embedding_.empty());
}

// An fp32 chunk is first cast to S (FSDP's MixedPrecision param_dtype): a transient the gather
// stream reads once the compute stream has written it.
template <class S> void GatherScheduler<S>::gather_into(std::int64_t u, TrackedBuffer<S>& out) {
  auto& st = state_;
  if (st.offload.params && st.shape(u).params_sharded) return gather_offloaded(u, out);
  const auto& us = st.shape(u);
  auto& buffers = st.unit(u);
  auto* gather = st.streams.gather.get();
  const auto chunk = static_cast<std::size_t>(us.chunk);
  TrackedBuffer<S> cast;
  const S* source = nullptr;
  if constexpr (kMixed) {
    if (st.policy.low_params) {
      source = buffers.low_params.data();
    } else {
      cast = st.allocator.template allocate_uninitialized<S>(MemoryCategory::buffers, us.chunk);
      st.backend.narrow(cast.data(), buffers.params.data(), us.chunk);
      st.backend.wait(gather, nullptr);
      source = cast.data();
    }
  } else {
    source = buffers.params.data();
  }
  st.backend.allocate_on(gather);
  out = st.allocator.template allocate_uninitialized<S>(MemoryCategory::buffers, us.padded);
  st.backend.allocate_on(nullptr);
  st.backend.record_use(out.data(), nullptr);
  gather->all_gather(source, out.data(), chunk, EngineState<S>::kS);
  if (!cast.empty()) {
    st.backend.record_use(cast.data(), gather);
    cast.reset();
  }
}

// Parameter offload: the unit's chunk goes host → device into its own slot of the gathered
// buffer (cast to S on the way when the host keeps fp32), and the all-gather runs in place.
template <class S>
void GatherScheduler<S>::gather_offloaded(std::int64_t u, TrackedBuffer<S>& out) {
  auto& st = state_;
  const auto& us = st.shape(u);
  auto& buffers = st.unit(u);
  auto* gather = st.streams.gather.get();
  out = st.allocator.template allocate_uninitialized<S>(MemoryCategory::buffers, us.padded);
  S* slot = out.data() + static_cast<std::int64_t>(st.shards.shard_rank) * us.chunk;
  st.timed(Part::copy, [&] {
    if (st.policy.low_params)
      st.backend.copy(slot, buffers.low_params.data(), us.chunk);
    else
      st.backend.narrow(slot, buffers.params.data(), us.chunk);
  });
  st.backend.wait(gather, nullptr);
  gather->all_gather(slot, out.data(), static_cast<std::size_t>(us.chunk), EngineState<S>::kS);
  st.backend.record_use(out.data(), gather);
}

// DDP under autocast: the S copy of unit u's fp32 parameters.
template <class S> void GatherScheduler<S>::copy_into(std::int64_t u, TrackedBuffer<S>& out) {
  const std::int64_t n = state_.shards.whole_elements(u, state_.spec());
  out = state_.allocator.template allocate_uninitialized<S>(MemoryCategory::buffers, n);
  state_.backend.narrow(out.data(), state_.unit(u).params.data(), n);
}

template <class S> void GatherScheduler<S>::wait_for_gathers(std::int64_t u) {
  if (needs_gather(u)) state_.backend.wait(nullptr, state_.streams.gather.get());
}

template <class S> void GatherScheduler<S>::acquire(std::int64_t u, bool backward) {
  auto& st = state_;
  auto& gathered = st.unit(u).gathered;
  if (st.shape(u).params_sharded && gathered.empty()) gather_into(u, gathered);
  if (st.is_head(u) && st.tied() && st.shape(0).params_sharded && head_embedding_.empty())
    gather_into(0, head_embedding_);
  if (needs_copy(u) && gathered.empty() && !(backward && u == 0)) {
    copy_into(u, gathered);
    if (st.is_head(u) && st.tied() && head_embedding_.empty()) copy_into(0, head_embedding_);
  }
}

template <class S> void GatherScheduler<S>::release(std::int64_t u) {
  state_.unit(u).gathered.reset();
  if (state_.is_head(u)) head_embedding_.reset();
}

template <class S> std::span<const S> GatherScheduler<S>::params_for(std::int64_t u) {
  auto& buffers = state_.unit(u);
  if (needs_gather(u) && state_.shape(u).params_sharded) return buffers.gathered.span();
  if (needs_copy(u)) return buffers.gathered.span();
  if constexpr (kMixed)
    return buffers.low_params.span();
  else
    return buffers.params.span();
}

template <class S> std::span<const S> GatherScheduler<S>::embedding_for_head() {
  if (!state_.tied()) return {};
  if (state_.shape(0).params_sharded || state_.policy.autocast_copies)
    return head_embedding_.span();
  if constexpr (kMixed)
    return state_.unit(0).low_params.span();
  else
    return state_.unit(0).params.span();
}

template <class S> void GatherScheduler<S>::prefetch_forward(std::int64_t u) {
  const int limit = state_.spec().max_inflight_allgathers;
  for (int ahead = 1; ahead <= depth_.forward; ++ahead) {
    const std::int64_t next = u + ahead;
    if (next >= state_.unit_count()) break;
    if (!needs_gather(next) || alive(next)) continue;
    const std::int64_t back = next - limit;  // must have been freed (rate limiter)
    if (back >= 0 && !kept(back) && alive(back)) break;
    acquire(next);
  }
}

template <class S> void GatherScheduler<S>::prefetch_backward(std::int64_t u) {
  const int limit = state_.spec().max_inflight_allgathers;
  for (int ahead = 1; ahead <= depth_.backward; ++ahead) {
    const std::int64_t next = u - ahead;
    if (next < 0) break;
    if (!needs_gather(next) || alive(next)) continue;
    if (next + limit <= u) break;  // unit next + limit has not finished its backward yet
    acquire(next);
  }
}

template <class S> void GatherScheduler<S>::gather_updated_parameters() {
  auto& st = state_;
  if (!st.spec().shard_optimizer) return;
  st.phase("parameter all-gather");
  auto* gather = st.streams.gather.get();
  st.backend.wait(gather, nullptr);  // after the optimizer's updates
  for (std::int64_t u = 0; u < st.unit_count(); ++u) {
    const auto& us = st.shape(u);
    if (us.params_sharded) continue;
    const auto chunk = static_cast<std::size_t>(us.chunk);
    if constexpr (kMixed) {
      if (st.policy.low_params) {
        S* p = st.unit(u).low_params.data();
        gather->all_gather(p + st.shards.chunk_begin(u), p, chunk, EngineState<S>::kS);
        continue;
      }
    }
    A* p = st.unit(u).params.data();
    gather->all_gather(p + st.shards.chunk_begin(u), p, chunk, EngineState<S>::kA);
  }
}

template class GatherScheduler<float>;
template class GatherScheduler<bf16>;
template class GatherScheduler<f16>;

}  // namespace shardplan::executor
