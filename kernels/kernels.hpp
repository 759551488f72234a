// The layer kernels of the GPT model, forward and backward, on plain row-major arrays (llm.c's
// layout: activations are [N = B·T tokens, C channels], token n = b·T + t). Templated on the
// element type S (scalar.hpp): the executor runs them in fp32, or in bf16 or f16 storage with
// every sum in fp32 (accum_t<S>; norm statistics and the loss's log-probabilities are fp32
// arrays); the gradient-check test runs them in fp64.
//
// Conventions: every backward kernel ADDS into the gradients it produces (inputs' and
// parameters'), so callers zero them once and gradient accumulation needs nothing more. A bias or
// optional pointer may be nullptr. No kernel allocates; scratch space is passed in.
#pragma once

#include <cstdint>

#include "kernels/scalar.hpp"

namespace shardplan::kernels {

// out[n, :] = wte[tokens[n], :] (+ wpe[t, :] when wpe is given).       wte [V, C], wpe [P, C]
template <class S>
void embedding_forward(S* out, const std::int32_t* tokens, const S* wte, const S* wpe,
                       std::int64_t batch, std::int64_t seq, std::int64_t channels);
template <class S>
void embedding_backward(S* dwte, S* dwpe, const S* dout, const std::int32_t* tokens,
                        std::int64_t batch, std::int64_t seq, std::int64_t channels);

// y [N, out] (+)= x [N, in] · wᵀ (+ b);  w [out, in] as nn.Linear stores it. accumulate: add to y.
template <class S>
void linear_forward(S* y, const S* x, const S* w, const S* b, std::int64_t n, std::int64_t in,
                    std::int64_t out, bool accumulate);
// dx += dy · w;  dw += dyᵀ · x;  db += Σₙ dy.  (dx may be nullptr)
template <class S>
void linear_backward(S* dx, S* dw, S* db, const S* dy, const S* x, const S* w, std::int64_t n,
                     std::int64_t in, std::int64_t out);

// LayerNorm (Ba et al. 2016): y = (x − μ)·rstd·w + b, rstd = 1/√(σ² + ε), biased variance as
// torch.nn.LayerNorm. Saves mean [N] and rstd [N] for the backward.
template <class S>
void layernorm_forward(S* y, accum_t<S>* mean, accum_t<S>* rstd, const S* x, const S* w, const S* b,
                       std::int64_t n, std::int64_t channels, accum_t<S> eps);
// With x̂ = (x − μ)·rstd and g = dy·w: dx += rstd·(g − mean(g) − x̂·mean(g·x̂)) (llm.c
// layernorm_backward); dw += dy·x̂; db += dy.
template <class S>
void layernorm_backward(S* dx, S* dw, S* db, const S* dy, const S* x, const S* w,
                        const accum_t<S>* mean, const accum_t<S>* rstd, std::int64_t n,
                        std::int64_t channels);

// RMSNorm (Zhang & Sennrich 2019; HF LlamaRMSNorm): y = x·rstd·w, rstd = 1/√(mean(x²) + ε).
template <class S>
void rmsnorm_forward(S* y, accum_t<S>* rstd, const S* x, const S* w, std::int64_t n,
                     std::int64_t channels, accum_t<S> eps);
// With x̂ = x·rstd and g = dy·w: dx += rstd·(g − x̂·mean(g·x̂)); dw += dy·x̂.
template <class S>
void rmsnorm_backward(S* dx, S* dw, const S* dy, const S* x, const S* w, const accum_t<S>* rstd,
                      std::int64_t n, std::int64_t channels);

// Rotary positions (Su et al. 2021, RoFormer eq. 34) in the "rotate half" pairing of HF
// modeling_llama.py apply_rotary_pos_emb: channel i pairs with i + d/2, angle = t·θ^(−2i/d),
// over the whole head. In place on x [N, heads·d]. The backward applies the inverse rotation to
// the gradient, in place. positions [seq]: token t's place in the sequence (context parallelism's
// share of it); nullptr: t itself.
template <class S>
void rope_forward(S* x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                  std::int64_t head_dim, double theta, const std::int32_t* positions = nullptr);
template <class S>
void rope_backward(S* dx, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                   std::int64_t head_dim, double theta, const std::int32_t* positions = nullptr);

// Causal scaled dot-product attention (Vaswani et al. 2017, eq. 1) with grouped-query heads
// (Ainslie et al. 2023; HF repeat_kv: query head h reads key/value head h / (heads / kv_heads)).
// q, out [N, heads·d]; k, v [N, kv_heads·d]; probs [B, heads, T, T] the softmax, zero above the
// diagonal (saved for the backward; the materialized-scores term of Korthikanti et al. 2022).
template <class S>
void attention_forward(S* out, S* probs, const S* q, const S* k, const S* v, std::int64_t batch,
                       std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                       std::int64_t head_dim);
// dP = dO·Vᵀ; dV += Pᵀ·dO; dS = P ∘ (dP − rowsum(P ∘ dP))·scale; dQ += dS·K; dK += dSᵀ·Q.
// scratch [T, T].
template <class S>
void attention_backward(S* dq, S* dk, S* dv, S* scratch, const S* dout, const S* probs, const S* q,
                        const S* k, const S* v, std::int64_t batch, std::int64_t seq,
                        std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim);

// GELU, tanh approximation (Hendrycks & Gimpel 2016 eq. for 0.5x(1 + tanh(√(2/π)(x + 0.044715x³)));
// GPT-2's "gelu_new", llm.c gelu_forward).
template <class S> void gelu_forward(S* out, const S* in, std::int64_t n);
template <class S> void gelu_backward(S* din, const S* in, const S* dout, std::int64_t n);

// SwiGLU (Shazeer 2020, eq. 6; HF LlamaMLP): out = silu(gate)·up, silu(g) = g·σ(g).
template <class S> void swiglu_forward(S* out, const S* gate, const S* up, std::int64_t n);
// dgate += dout·up·σ(g)(1 + g(1 − σ(g)));  dup += dout·silu(g).
template <class S>
void swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up, std::int64_t n);

// The loss as PyTorch computes it in fp32 (torch.nn.functional.cross_entropy = nll_loss ∘
// log_softmax; aten/src/ATen/native/LossNLL.cpp, SoftMax.cpp), so the tensors the head keeps and
// makes are PyTorch's: log_softmax saves its output, nll_loss's backward makes a gradient of the
// log-probabilities, log_softmax's backward a gradient of the logits.
// logp [N, V] = z − max − log Σ exp(z − max), row by row.
template <class S>
void log_softmax_forward(accum_t<S>* logp, const S* logits, std::int64_t n, std::int64_t vocab);
// Σₙ −logp[n, target[n]] (accumulated in double).
template <class S>
double nll_loss_forward(const accum_t<S>* logp, const std::int32_t* targets, std::int64_t n,
                        std::int64_t vocab);
// dlogp[n, target[n]] += −scale (scale = dloss/dsum, e.g. 1/N); the other entries are untouched.
template <class S>
void nll_loss_backward(accum_t<S>* dlogp, const std::int32_t* targets, std::int64_t n,
                       std::int64_t vocab, accum_t<S> scale);
// dlogits = dlogp − exp(logp)·Σⱼ dlogp[n, j]  (torch's _log_softmax_backward_data). Unlike the
// other backward kernels it WRITES its output: the logits have no other gradient.
template <class S>
void log_softmax_backward(S* dlogits, const accum_t<S>* dlogp, const accum_t<S>* logp,
                          std::int64_t n, std::int64_t vocab);

// Vocabulary parallelism (Megatron-LM's VocabParallelEmbedding and vocab_parallel_cross_entropy,
// megatron/core/tensor_parallel/layers.py and cross_entropy.py): this rank holds the rows
// [begin, begin + rows) of the [V, C] token table and the logits [n, rows] of those rows.
//
// out[n, :] = wte[tokens[n] − begin, :] for a token of this range, 0 for any other (+ wpe[t, :]
// when wpe is given).                                                   wte [rows, C], wpe [P, C]
template <class S>
void vocab_embedding_forward(S* out, const std::int32_t* tokens, const S* wte, const S* wpe,
                             std::int64_t begin, std::int64_t rows, std::int64_t batch,
                             std::int64_t seq, std::int64_t channels);
// Adds dout's rows into wte's rows of the tokens of this range (and every row into wpe), summed
// as embedding_backward sums them.
template <class S>
void vocab_embedding_backward(S* dwte, S* dwpe, const S* dout, const std::int32_t* tokens,
                              std::int64_t begin, std::int64_t rows, std::int64_t batch,
                              std::int64_t seq, std::int64_t channels);
// max[i] = maxⱼ logits[i, j] over this rank's columns (before the all-reduce of the maxima).
template <class S>
void logits_row_max(accum_t<S>* max, const S* logits, std::int64_t n, std::int64_t vocab);
// sum[i] = Σⱼ exp(logits[i, j] − max[i]) over this rank's columns, max the group's.
template <class S>
void logits_row_sum_exp(accum_t<S>* sum, const S* logits, const accum_t<S>* max, std::int64_t n,
                        std::int64_t vocab);
// logp[i, j] = logits[i, j] − (max[i] + log sum[i]): the log-softmax over the whole vocabulary
// from the group's maximum and sum.
template <class S>
void log_softmax_from_stats(accum_t<S>* logp, const S* logits, const accum_t<S>* max,
                            const accum_t<S>* sum, std::int64_t n, std::int64_t vocab);
// Σ over the targets in [begin, begin + vocab) of −logp[n, target − begin] (the other ranks hold
// the rest).
template <class S>
double vocab_nll_loss_forward(const accum_t<S>* logp, const std::int32_t* targets,
                              std::int64_t begin, std::int64_t n, std::int64_t vocab);
// dlogits = scale · (exp(logp) − onehot(target − begin)): the cross-entropy's gradient of this
// rank's logits (softmax minus the one-hot of a target it owns). WRITES its output.
template <class S>
void vocab_cross_entropy_backward(S* dlogits, const accum_t<S>* logp, const std::int32_t* targets,
                                  std::int64_t begin, std::int64_t n, std::int64_t vocab,
                                  accum_t<S> scale);

}  // namespace shardplan::kernels
