// Causal attention on a CUDA device without the [B, heads, T, T] probabilities: the tiled, online
// softmax of FlashAttention (Dao et al. 2022, Algorithm 1) with the work split and the backward of
// FlashAttention-2 (Dao 2023, Algorithms 1 and 2). The forward keeps one fp32 log-sum-exp per head
// and token instead of the probabilities, the saved statistics the cost model counts for
// AttentionImpl::flash (costmodel/block_table.cpp). Same semantics as the host kernels
// attention_forward / attention_backward of kernels/kernels.hpp.
//
// Storage S (kernels/scalar.hpp): float, bf16 or f16 for q, k, v, out and their gradients, each
// function explicitly instantiated for the three in flash_attention.cu; lse and delta are fp32 in
// every precision, and so is the arithmetic (elements are converted when loaded, rounded to S once
// when stored).
//
// Layouts (row-major, token n = b·T + t, as the host kernels):
//   q, out, dq, dout  [B, T, heads, d]      (a token's row is heads·d wide)
//   k, v, dk, dv      [B, T, kv_heads, d]   (grouped-query heads: q head h reads kv head
//                                            h / (heads / kv_heads), HF repeat_kv)
//   lse, delta        [B, heads, T] float
// Every pointer is a device pointer; every call queues its work on `stream` and returns (nothing
// synchronizes). A call checks its launch (cudaGetLastError) and throws std::runtime_error with one
// line naming the kernel and the value it cannot take; sizes of zero queue nothing.
//
// This header is plain C++ (host-compiled files include it): declarations only.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/scalar.hpp"

namespace shardplan::kernels::cuda {

// out = softmax(q·kᵀ·scale + causal mask)·v with scale = 1/√d (Vaswani et al. 2017, eq. 1); the
// scores are never stored. lse[b, h, t] = log Σ_{j ≤ t} exp(scale·q_t·k_j), saved for the backward.
template <class S>
void flash_attention_forward(cudaStream_t stream, S* out, float* lse, const S* q, const S* k,
                             const S* v, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                             std::int64_t kv_heads, std::int64_t head_dim);

// ADDS the gradients into dq, dk, dv (same layouts as q, k, v), recomputing the probabilities from
// lse: P = exp(S − lse); dV += Pᵀ·dO; dP = dO·Vᵀ; dS = P ∘ (dP − D); dQ += dS·K·scale;
// dK += dSᵀ·Q·scale (FlashAttention-2, Algorithm 2). delta [B, heads, T] is scratch that receives
// D = rowsum(dO ∘ O). out and lse are the forward's. In bf16 and f16 each gradient element is
// rounded once (dq's sum over the key tiles is kept in fp32 by a kernel of its own).
template <class S>
void flash_attention_backward(cudaStream_t stream, S* dq, S* dk, S* dv, float* delta, const S* dout,
                              const S* out, const float* lse, const S* q, const S* k, const S* v,
                              std::int64_t batch, std::int64_t seq, std::int64_t heads,
                              std::int64_t kv_heads, std::int64_t head_dim);

// True for the head dims the kernels are built for: 16, 32, 64, 80, 96, 128 and 256 in fp32; 64
// and 128 in bf16 and f16. The calls throw for any other.
template <class S = float> bool flash_attention_supports(std::int64_t head_dim);

}  // namespace shardplan::kernels::cuda
