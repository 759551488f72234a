// Causal attention on the host without the [B, heads, T, T] probabilities: the tiled, online
// softmax of FlashAttention-2 (Dao 2023, Algorithm 1 forward, Algorithm 2 backward) over blocks of
// kQueryBlock query rows and kKeyBlock keys. The forward keeps one log-sum-exp per head and token
// (accum_t<S>: fp32 for every storage type but the gradient check's double) instead of the
// probabilities: the saved statistics the cost model counts for AttentionImpl::flash
// (costmodel/block_table.cpp, 4·a·T bytes per sequence). The backward recomputes the probabilities
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

// Context parallelism's pieces of the same attention (ring attention: Liu et al. 2023, "Ring
// Attention with Blockwise Transformers"; Brandon et al. 2023, "Striped Attention"): the
// queries of one rank's tokens against the keys of one rank's tokens, each token at its position
// in the whole sequence, key j visible to query i when key_pos[j] ≤ query_pos[i].
//   q, out_acc, dq, dout, out   [B, queries, heads, d]
//   k, v, dk, dv                [B, keys, kv_heads, d]
//   lse, delta                  [B, heads, queries]   accum_t<S>
struct Positions {
  const std::int32_t* query = nullptr;  // [queries] each query row's place in the sequence
  std::int64_t queries = 0;
  const std::int32_t* key = nullptr;  // [keys]
  std::int64_t keys = 0;
};

// One more block of keys into a running softmax: out_acc and lse hold the output (normalised,
// accum_t<S>) and log-sum-exp over the keys seen so far, and after the call over these too — the
// online softmax of FlashAttention-2 Algorithm 1 started from (m = lse, ℓ = 1, acc = out_acc).
// first: no keys seen yet (out_acc and lse are only written). A row that has seen no visible key
// keeps out 0 and lse −∞.
template <class S>
void forward_at(accum_t<S>* out_acc, accum_t<S>* lse, const S* q, const S* k, const S* v,
                Positions at, bool first, std::int64_t batch, std::int64_t heads,
                std::int64_t kv_heads, std::int64_t head_dim);

// backward's formulas over one block of keys, with the output and log-sum-exp of the whole
// attention (over every key block): ADDS into dq [queries] and dk, dv [keys]; writes delta.
template <class S>
void backward_at(S* dq, S* dk, S* dv, accum_t<S>* delta, const S* dout, const S* out,
                 const accum_t<S>* lse, const S* q, const S* k, const S* v, Positions at,
                 std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                 std::int64_t head_dim);

}  // namespace shardplan::kernels::flash_host
