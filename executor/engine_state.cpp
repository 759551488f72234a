#include "executor/engine_state.hpp"

#include <algorithm>
#include <cmath>
#include <ctime>  // clock_gettime, CLOCK_THREAD_CPUTIME_ID (POSIX's <time.h>)
#include <stdexcept>
#include <type_traits>

#include <fmt/format.h>

#include "executor/param_init.hpp"
#include "kernels/backend.hpp"
#include "kernels/scalar.hpp"

namespace shardplan::executor {

using kernels::Backend;
using kernels::bf16;
using kernels::f16;
using kernels::HostBackend;
using kernels::narrow;
namespace {

void check_group(const comm::Communicator* c, int size, int rank, const char* name) {
  if (c == nullptr) throw std::invalid_argument(fmt::format("the {} group is missing", name));
  if (c->size() != size || c->rank() != rank)
    throw std::invalid_argument(
        fmt::format("the {} group has rank {} of {}, the layout needs {} of {}", name, c->rank(),
                    c->size(), rank, size));
}

template <class S> Backend<S>* backend_of(const EngineOptions& o) {
  if constexpr (std::is_same_v<S, float>)
    return o.backend;
  else if constexpr (std::is_same_v<S, bf16>)
    return o.backend_bf16;
  else
    return o.backend_f16;
}

}  // namespace

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

void check_engine_options(const EngineOptions& o, const EngineGroups& groups) {
  const auto& spec = o.spec;
  if (groups.world == nullptr) throw std::invalid_argument("the world group is missing");
  if (spec.shard_parameters && !spec.shard_gradients)
    throw std::invalid_argument(
        "shard_parameters needs shard_gradients (no framework does otherwise)");
  if (spec.shard_gradients && !spec.shard_optimizer)
    throw std::invalid_argument(
        "shard_gradients needs shard_optimizer (no framework does otherwise)");
  if (o.grad_accumulation < 1)
    throw std::invalid_argument(fmt::format("{} micro-batches per step", o.grad_accumulation));
  if (o.micro_batch.batch < 1 || o.micro_batch.seq < 1)
    throw std::invalid_argument("the micro-batch is empty");
}

std::string phase_text(std::int64_t step, std::int64_t grad_accumulation, const char* part,
                       std::int64_t unit, std::int64_t micro_batch) {
  std::string text = fmt::format("step {}", step);
  if (micro_batch >= 0 && grad_accumulation > 1)
    text += fmt::format(" micro-batch {}", micro_batch + 1);
  text += fmt::format(" {}", part);
  if (unit >= 0) text += fmt::format(" unit {}", unit);
  return text;
}

template <class S>
EngineState<S>::EngineState(EngineOptions opts, TrackedAllocator& device, EngineGroups groups_in)
    : options(std::move(opts)), allocator(device), groups(groups_in),
      host_backend(backend_of<S>(options) ? nullptr
                                          : std::make_unique<HostBackend<S>>(&device.source())),
      backend(backend_of<S>(options) ? *backend_of<S>(options) : *host_backend),
      model(options.model, device, options.model_options, &backend) {
  check_engine_options(options, groups);
  set_policy();
  offload = offload_policy(options.spec);
  if (offload.optimizer && !allocator.host_accessible())
    throw std::invalid_argument("offload runs on the CPU backend (its host pool is the heap)");
  shards =
      make_shard_layout(model.layout(), options.spec, groups.world->size(), groups.world->rank());
  make_streams();
  units.resize(static_cast<std::size_t>(model.layout().unit_count()));
  allocate_parameters();
  allocate_optimizer_states();
}

template <class S> void EngineState<S>::set_policy() {
  const auto want = documents::compute_dtype(options.precision);
  const bool mixed = options.precision != documents::Precision::fp32;
  if (mixed != kMixed || (std::is_same_v<S, bf16> && want != documents::DType::bf16) ||
      (std::is_same_v<S, f16> && want != documents::DType::fp16))
    throw std::logic_error("the engine's compute type is not the precision's");
  policy = precision_policy(options.precision, options.spec);
  if (policy.loss_scaling) {
    if (!(options.initial_loss_scale > 0) || !std::isfinite(options.initial_loss_scale))
      throw std::invalid_argument(
          fmt::format("initial loss scale {}: must be positive", options.initial_loss_scale));
    initial_loss_scale = options.initial_loss_scale;
  }
}

template <class S> void EngineState<S>::make_streams() {
  check_group(groups.shard, shards.group, shards.shard_rank, "shard");
  if (shards.replicas > 1)
    check_group(groups.replica, shards.replicas, shards.replica_rank, "replica");
  streams.gather = std::make_unique<TimedCommunicator>(*groups.shard, stats);
  if (groups.shard_reduce != nullptr) {
    check_group(groups.shard_reduce, shards.group, shards.shard_rank, "shard reduce");
    streams.reduce = std::make_unique<TimedCommunicator>(*groups.shard_reduce, stats);
  } else {
    streams.reduce = std::make_unique<TimedCommunicator>(*groups.shard, stats);
  }
  if (shards.replicas > 1)
    streams.replica = std::make_unique<TimedCommunicator>(*groups.replica, stats);
}

// Parameters at rest: the chunk when partitioned (in the host pool under parameter offload),
// else whole; S under DeepSpeed's mixed precision, else fp32.
template <class S> void EngineState<S>::allocate_parameters() {
  const auto& spec = options.spec;
  for (std::int64_t u = 0; u < unit_count(); ++u) {
    auto& buffers = unit(u);
    const auto& us = shape(u);
    const std::int64_t n = us.params_sharded ? us.chunk : shards.whole_elements(u, spec);
    const std::int64_t first = us.params_sharded ? shards.chunk_begin(u) : 0;
    TrackedAllocator& at_rest = offload.params && us.params_sharded ? host_pool : allocator;
    if (policy.low_params) {
      buffers.low_params = at_rest.allocate<S>(MemoryCategory::parameters, n);
      write_initial(buffers.low_params, u, first);
    } else {
      buffers.params = at_rest.allocate<A>(MemoryCategory::parameters, n);
      write_initial(buffers.params, u, first);
    }
  }
}

// AdamW's moments (and DeepSpeed's fp32 master, or the host master under optimizer offload):
// a chunk under a sharded optimizer, else whole.
template <class S> void EngineState<S>::allocate_optimizer_states() {
  const auto& spec = options.spec;
  for (std::int64_t u = 0; u < unit_count(); ++u) {
    auto& buffers = unit(u);
    const auto& us = shape(u);
    const std::int64_t n = spec.shard_optimizer ? us.chunk : us.size;
    TrackedAllocator& states = optimizer_allocator();
    if (policy.low_params) {  // DeepSpeed's fp32 master partition
      buffers.params = states.allocate<A>(MemoryCategory::optimizer_states, n);
      write_initial(buffers.params, u, spec.shard_optimizer ? shards.chunk_begin(u) : 0);
    } else if (offload.optimizer && !(offload.params && us.params_sharded)) {
      buffers.host_master = host_pool.allocate<A>(MemoryCategory::optimizer_states, n);
      write_initial(buffers.host_master, u, shards.chunk_begin(u));
    }
    buffers.exp_avg = states.allocate<A>(MemoryCategory::optimizer_states, n);
    buffers.exp_avg_sq = states.allocate<A>(MemoryCategory::optimizer_states, n);
  }
}

template <class S>
template <class T>
void EngineState<S>::write_initial(TrackedBuffer<T>& out, std::int64_t u, std::int64_t first) {
  const std::int64_t n = out.size();
  std::vector<A> values(static_cast<std::size_t>(n));
  const auto& tp = options.model_options.tensor_parallel;
  if (tp.active())  // this rank's slice of the full model's initial values
    init_local_params<A>(tp, model.layout(), u, options.seed, first, values);
  else
    init_unit_params<A>(model.layout(), u, options.seed, first, values);
  std::vector<T> typed(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) typed[i] = narrow<T>(values[i]);
  if (allocator.host_accessible())
    std::copy(typed.begin(), typed.end(), out.data());
  else
    allocator.source().write(out.data(), typed.data(), n * static_cast<std::int64_t>(sizeof(T)));
}

template struct EngineState<float>;
template struct EngineState<bf16>;
template struct EngineState<f16>;

}  // namespace shardplan::executor
