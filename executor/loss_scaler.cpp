#include "executor/loss_scaler.hpp"

namespace shardplan::executor {

bool LossScaler::update(bool finite) {
  if (!finite) {
    scale_ *= 0.5;
    good_steps_ = 0;
    return false;
  }
  if (++good_steps_ == kGrowthInterval) {
    scale_ *= 2;
    good_steps_ = 0;
  }
  return true;
}

}  // namespace shardplan::executor
