// Causal attention on the host without the [B, heads, T, T] probabilities: the tiled, online
// softmax of FlashAttention-2 (Dao 2023, Algorithm 1 forward, Algorithm 2 backward) over blocks of
// kQueryBlock query rows and kKeyBlock keys. The forward keeps one log-sum-exp per head and token
// (accum_t<S>: fp32 for every storage type but the gradient check's double) instead of the
// probabilities: the saved statistics the cost model counts for AttentionImpl::flash
// (costmodel/accounting.cpp, 4·a·T bytes per sequence). The backward recomputes the probabilities
// of each tile from it. Same semantics as kernels::attention_forward / attention_backward
// (kernels.hpp) and the CUDA backend's kernels/cuda/flash_attention.hpp.
//
// Layouts (row-major, token n = b·T + t):
//   q, out, dq, dout  [B, T, heads, d]
//   k, v, dk, dv      [B, T, kv_heads, d]   (query head h reads kv head h / (heads / kv_heads))
//   lse, delta        [B, heads, T]         accum_t<S>
//
// Working memory: one tile of scores and the running row statistics (kQueryBlock × kKeyBlock and
// kQueryBlock × d elements of accum_t<S>, what a GPU keeps in registers and shared memory) and in
// the backward one head's dQ accumulator [T, d] in accum_t<S> (FlashAttention-2's dq_accum, one
// head at a time); held by the call, not by the tracked allocator (as Eigen's GEMM packing).
#pragma once

#include <cstdint>

#include "kernels/scalar.hpp"

namespace shardplan::kernels::flash_host {

inline constexpr std::int64_t kQueryBlock = 64;  // B_r, query rows per tile
inline constexpr std::int64_t kKeyBlock = 64;    // B_c, keys per tile

// out = softmax(q·kᵀ/√d + causal mask)·v (Vaswani et al. 2017, eq. 1);
// lse[b, h, t] = log Σ_{j ≤ t} exp(q_t·k_j/√d).
template <class S>
void forward(S* out, accum_t<S>* lse, const S* q, const S* k, const S* v, std::int64_t batch,
             std::int64_t seq, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim);

// ADDS into dq, dk, dv: with P = exp(scale·Q·Kᵀ − lse) (masked), D = rowsum(dO ∘ O) (written into
// delta), dV += Pᵀ·dO, dS = P ∘ (dO·Vᵀ − D), dQ += scale·dS·K, dK += scale·dSᵀ·Q.
template <class S>
void backward(S* dq, S* dk, S* dv, accum_t<S>* delta, const S* dout, const S* out,
              const accum_t<S>* lse, const S* q, const S* k, const S* v, std::int64_t batch,
              std::int64_t seq, std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim);

}  // namespace shardplan::kernels::flash_host
