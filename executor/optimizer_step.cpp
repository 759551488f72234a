#include "executor/optimizer_step.hpp"
#include "kernels/scalar.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace shardplan::executor {

using kernels::bf16;
using kernels::f16;

template <class S>
OptimizerStep<S>::OptimizerStep(EngineState<S>& state)
    : state_(state),
      scaler_(state.policy.loss_scaling ? LossScaler(state.initial_loss_scale) : LossScaler()) {}

template <class S> typename OptimizerStep<S>::Part OptimizerStep<S>::part_of(std::int64_t u) const {
  const auto& us = state_.shape(u);
  if (state_.spec().shard_optimizer) return {state_.shards.chunk_begin(u), us.chunk};
  return {0, us.size};
}

// Under DeepSpeed the fp32 gradient is a transient copy of the gradient partition (the cost
// model's step_grad): stages 1 and 2 cast their S partition, stage 3 flattens its fp32 partition
// into a new tensor (stage3.py, _prepare_fp32_grad_for_sub_group).
template <class S>
typename OptimizerStep<S>::StepGrad OptimizerStep<S>::step_grad(std::int64_t u, Part part) {
  auto& st = state_;
  if (st.offload.optimizer) return offloaded_step_grad(u, part);
  auto& buffers = st.unit(u);
  const bool sharded = st.spec().shard_gradients;
  StepGrad out;
  const S* low = nullptr;
  if constexpr (kMixed) {
    if (sharded && st.policy.low_kept_chunk)
      low = buffers.low_grad_chunk.data();
    else if (!sharded && st.low_whole())
      low = buffers.low_whole_grads.data() + part.begin;
  }
  A* kept = low != nullptr ? nullptr
            : sharded      ? buffers.grad_chunk.data()
                           : buffers.whole_grads.data() + part.begin;
  if (!st.policy.low_params) {
    out.data = kept;
    return out;
  }
  if (low != nullptr) {  // zeroed, then the widened S partition added
    out.copy = st.allocator.template allocate<A>(MemoryCategory::gradients, part.elements);
    st.backend.widen_add(out.copy.data(), low, part.elements);
  } else {
    out.copy =
        st.allocator.template allocate_uninitialized<A>(MemoryCategory::gradients, part.elements);
    st.backend.copy_wide(out.copy.data(), kept, part.elements);
  }
  out.data = out.copy.data();
  return out;
}

// The fp32 gradient AdamW reads on the host: the kept host chunk (sharded gradients), or this
// rank's part of the device's whole gradient copied device → host (ZeRO-1), timed with the
// optimizer.
template <class S>
typename OptimizerStep<S>::StepGrad OptimizerStep<S>::offloaded_step_grad(std::int64_t u,
                                                                          Part part) {
  auto& st = state_;
  auto& buffers = st.unit(u);
  StepGrad out;
  if (st.spec().shard_gradients) {
    out.data = buffers.grad_chunk.data();
    return out;
  }
  out.copy = st.host_pool.template allocate<A>(MemoryCategory::gradients, part.elements);
  if (st.low_whole())
    st.backend.widen_add(out.copy.data(), buffers.low_whole_grads.data() + part.begin,
                         part.elements);
  else
    st.backend.copy_wide(out.copy.data(), buffers.whole_grads.data() + part.begin, part.elements);
  out.data = out.copy.data();
  return out;
}

// Whether every rank's gradients are finite (fp16's loss scaling), a world all-reduce.
template <class S>
bool OptimizerStep<S>::finite_everywhere(const std::vector<StepGrad>& grads,
                                         const std::vector<Part>& parts) {
  auto& st = state_;
  double bad = 0;
  for (std::size_t u = 0; u < grads.size(); ++u)
    if (!st.backend.all_finite(grads[u].data, parts[u].elements)) bad = 1;
  if (st.groups.stand_in) return bad == 0;
  auto* world = st.groups.world;
  auto buffer = world->allocate(sizeof(double));
  buffer->copy_from_host(&bad, sizeof(double));
  world->all_reduce(buffer->data(), buffer->data(), 1, comm::DataType::f64);
  world->synchronize();
  buffer->copy_to_host(&bad, sizeof(double));
  return bad == 0;
}

// fp16: false (and the scale backed off) when a gradient is not finite somewhere; else the
// gradients unscaled in place (the kept fp32 gradient is freed after the step anyway).
template <class S>
bool OptimizerStep<S>::unscale_or_skip(const std::vector<StepGrad>& grads,
                                       const std::vector<Part>& parts) {
  if (!finite_everywhere(grads, parts)) return scaler_.update(false);
  for (std::size_t u = 0; u < grads.size(); ++u)
    state_.backend.scale(grads[u].data, parts[u].elements, 1.0 / scaler_.scale());
  return scaler_.update(true);
}

template <class S> bool OptimizerStep<S>::run() {
  state_.phase("optimizer");
  std::vector<StepGrad> grads;
  std::vector<Part> parts;
  for (std::int64_t u = 0; u < state_.unit_count(); ++u) {
    parts.push_back(part_of(u));
    grads.push_back(step_grad(u, parts.back()));
  }
  if (scaler_.enabled() && !unscale_or_skip(grads, parts)) return false;
  for (std::int64_t u = 0; u < state_.unit_count(); ++u)
    update_unit(u, grads[static_cast<std::size_t>(u)], parts[static_cast<std::size_t>(u)]);
  return true;
}

// AdamW on unit u's master; DeepSpeed then rounds it into its S partition, offload uploads it.
template <class S>
void OptimizerStep<S>::update_unit(std::int64_t u, const StepGrad& grad, Part part) {
  auto& st = state_;
  auto& buffers = st.unit(u);
  const auto& us = st.shape(u);
  const std::int64_t n = part.elements;
  // The master: DeepSpeed's is a chunk (its optimizer is sharded); fp32 parameters at rest are a
  // chunk when partitioned, else whole.
  A* master = st.policy.low_params || us.params_sharded ? buffers.params.data()
                                                        : buffers.params.data() + part.begin;
  if (!buffers.host_master.empty()) master = buffers.host_master.data();
  if (buffers.exp_avg.size() != n)
    throw std::logic_error(fmt::format("unit {}: {} optimizer elements for {} parameters", u,
                                       buffers.exp_avg.size(), n));
  st.backend.adamw_step(master, grad.data, buffers.exp_avg.data(), buffers.exp_avg_sq.data(), n,
                        st.step_count, st.options.adamw);
  if constexpr (kMixed)
    if (st.policy.low_params)
      st.backend.narrow(us.params_sharded ? buffers.low_params.data()
                                          : buffers.low_params.data() + part.begin,
                        master, n);
  if (!buffers.host_master.empty()) upload_parameters(u, part);
}

// After AdamW on the host master: the updated part host → device (the device's fp32 parameters;
// DeepSpeed's S partition is rounded from the master by update_unit). Timed with the optimizer,
// as the cost model's "CPU optimizer step" and "parameters to device".
template <class S> void OptimizerStep<S>::upload_parameters(std::int64_t u, Part part) {
  auto& buffers = state_.unit(u);
  A* device =
      state_.shape(u).params_sharded ? buffers.params.data() : buffers.params.data() + part.begin;
  state_.backend.copy_wide(device, buffers.host_master.data(), part.elements);
}

template class OptimizerStep<float>;
template class OptimizerStep<bf16>;
template class OptimizerStep<f16>;

}  // namespace shardplan::executor
