// The optimizer step over this rank's part of every unit (engine.hpp): the fp32 gradient AdamW
// reads (a transient widened copy under DeepSpeed's mixed precision; copied to the host under
// optimizer offload), fp16's loss scaling (loss_scaler.hpp: a world all-reduce of "any gradient
// not finite", the gradients unscaled in place), AdamW on the master weights, then DeepSpeed's
// rounding of the master into its S partition and offload's upload of the updated parameters.
#pragma once

#include <cstdint>
#include <vector>

#include "executor/engine_state.hpp"
#include "executor/loss_scaler.hpp"
#include "kernels/scalar.hpp"

namespace shardplan::executor {

template <class S> class OptimizerStep {
public:
  explicit OptimizerStep(EngineState<S>& state);

  // AdamW on the master weights. Returns whether the update ran (fp16: not when a gradient
  // overflowed on some rank; the loss scale is halved then).
  bool run();

  const LossScaler& loss_scaler() const { return scaler_; }

private:
  using A = typename EngineState<S>::A;
  static constexpr bool kMixed = EngineState<S>::kMixed;

  // The fp32 gradient the optimizer reads for a unit: `data`, pointing into the kept gradient
  // or into `copy`, a transient of the optimizer's elements.
  struct StepGrad {
    A* data = nullptr;
    TrackedBuffer<A> copy;
  };
  // This rank's part of unit u: `elements` from `begin` of the unit's flat buffer.
  struct Part {
    std::int64_t begin = 0;
    std::int64_t elements = 0;
  };
  Part part_of(std::int64_t u) const;
  StepGrad step_grad(std::int64_t u, Part part);
  StepGrad offloaded_step_grad(std::int64_t u, Part part);
  bool finite_everywhere(const std::vector<StepGrad>& grads, const std::vector<Part>& parts);
  bool unscale_or_skip(const std::vector<StepGrad>& grads, const std::vector<Part>& parts);
  void update_unit(std::int64_t u, const StepGrad& grad, Part part);
  void upload_parameters(std::int64_t u, Part part);

  EngineState<S>& state_;
  LossScaler scaler_;
};

extern template class OptimizerStep<float>;
extern template class OptimizerStep<kernels::bf16>;
extern template class OptimizerStep<kernels::f16>;

}  // namespace shardplan::executor
