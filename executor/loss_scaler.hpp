// fp16-mixed's dynamic loss scale, as torch.cuda.amp.GradScaler keeps it
// (torch/amp/grad_scaler.py): the loss is multiplied by the scale before the backward; a step
// whose gradients are not finite on some rank is skipped and the scale halved (backoff_factor
// 0.5); after growth_interval (2000) finite steps in a row the scale is doubled (growth_factor 2).
// The first scale is EngineOptions::initial_loss_scale (GradScaler's init_scale, 2^16).
#pragma once

#include <cstdint>

namespace shardplan::executor {

class LossScaler {
public:
  static constexpr std::int64_t kGrowthInterval = 2000;

  // Disabled: the scale stays 1 and every step updates.
  LossScaler() = default;
  explicit LossScaler(double initial_scale) : enabled_(true), scale_(initial_scale) {}

  bool enabled() const { return enabled_; }
  // The scale the next backward multiplies the loss by; the optimizer divides the gradients by
  // it before the update.
  double scale() const { return scale_; }
  // After the gradients were checked: not finite halves the scale and returns false (the step
  // is skipped); finite counts a good step, doubling the scale after kGrowthInterval of them, and
  // returns true. Unscale the gradients with scale() before calling this.
  bool update(bool finite);
  std::int64_t good_steps() const { return good_steps_; }

private:
  bool enabled_ = false;
  double scale_ = 1;
  std::int64_t good_steps_ = 0;  // since the scale last changed
};

}  // namespace shardplan::executor
