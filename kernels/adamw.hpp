// AdamW on a flat span: parameters, gradients and the two moments of any contiguous range — a
// whole unit, or one rank's shard of it — so sharded and unsharded runs take the same steps.
#pragma once

#include <cstdint>
#include <span>

namespace shardplan::kernels {

struct AdamWOptions {
  double lr = 1e-3;  // torch.optim.AdamW defaults
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;  // applied to every element of the span (one parameter group)
};

// One step, `step` counting from 1 (the bias corrections use it). Follows torch.optim.AdamW
// (torch/optim/adamw.py, _single_tensor_adamw, amsgrad=False, maximize=False), element-wise:
//   θ ← θ·(1 − lr·λ)                              decoupled weight decay (Loshchilov & Hutter 2019)
//   m ← m + (1 − β₁)·(g − m)                      exp_avg.lerp_(grad, 1 − β₁)
//   v ← β₂·v + (1 − β₂)·g²
//   θ ← θ − (lr / (1 − β₁ᵗ)) · m / (√v / √(1 − β₂ᵗ) + ε)
// The scalar factors are computed in double, the element-wise arithmetic in S.
// Throws std::invalid_argument when the spans differ in size or step < 1.
template <class S>
void adamw_step(std::span<S> params, std::span<const S> grads, std::span<S> exp_avg,
                std::span<S> exp_avg_sq, std::int64_t step, const AdamWOptions& options);

}  // namespace shardplan::kernels
