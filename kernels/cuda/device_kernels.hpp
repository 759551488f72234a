// The layer kernels of kernels/kernels.hpp on a CUDA device: the same semantics, the same
// argument order, every pointer a device pointer, `const Launch&` first. Shapes as there:
// activations [N = B·T tokens, C channels] row-major, token n = b·T + t; every backward kernel
// ADDS into the gradients it produces (log_softmax_backward WRITES, as on the host).
//
// Storage S (kernels/scalar.hpp): float, bf16 or f16, every template below explicitly instantiated
// for the three in device_kernels.cu. Whatever S, elements are converted to float when loaded, the
// arithmetic is fp32, and each stored result is rounded to S once (to nearest, ties to even), as
// PyTorch's kernels under autocast or FSDP's MixedPrecision compute (acc_type = float). What needs
// fp32's range stays float in every precision: the norm statistics (mean, rstd), the loss's
// log-probabilities and their gradient, the master weights and optimizer states (adamw_step,
// scale, count_nonfinite are float only).
//
// Every call queues its work on launch.stream and returns; nothing here synchronizes. Each one
// checks the launch (cudaGetLastError, the cuBLAS status) and throws std::runtime_error with one
// line naming the kernel; sizes of zero queue nothing. The GEMMs go through cuBLAS on launch.blas:
// fp32 with cublasSgemm, whose math mode decides fp32 or TF32 (set_tf32); bf16 and f16 with
// cublasGemmEx (16-bit A, B, C; CUBLAS_COMPUTE_32F: fp32 products and sums, C rounded once).
//
// This header is plain C++ (it is included by host-compiled files): declarations only.
#pragma once

#include <cstdint>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "kernels/scalar.hpp"

namespace shardplan::kernels::cuda {

// Where work is queued.
struct Launch {
  cudaStream_t stream = nullptr;  // every kernel and copy goes here
  cublasHandle_t blas = nullptr;  // bound to `stream` by the caller (cublasSetStream)
};

// TF32 tensor cores for the fp32 GEMMs, as PyTorch's torch.backends.cuda.matmul.allow_tf32
// (off by default there since PyTorch 1.12): CUBLAS_TF32_TENSOR_OP_MATH when on,
// CUBLAS_DEFAULT_MATH (full fp32) when off.
void set_tf32(cublasHandle_t blas, bool enabled);

// out [N, C] = wte[tokens[n], :] (+ wpe[t, :] when wpe is given).      wte [V, C], wpe [P, C]
template <class S>
void embedding_forward(const Launch& launch, S* out, const std::int32_t* tokens, const S* wte,
                       const S* wpe, std::int64_t batch, std::int64_t seq, std::int64_t channels);
// dwte[tokens[n], :] += dout[n, :]; dwpe[t, :] += Σ_b dout[b·T + t, :] when dwpe is given. fp32
// adds atomically (tokens repeat); bf16 and f16 sum each token's rows in fp32 first and round
// dwte's row once (no 16-bit atomics, whose every add would round).
template <class S>
void embedding_backward(const Launch& launch, S* dwte, S* dwpe, const S* dout,
                        const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                        std::int64_t channels);

// y [n, out] (+)= x [n, in] · wᵀ (+ b);  w [out, in] as nn.Linear stores it; accumulate: add to y
// (the GEMM's beta). b may be nullptr.
template <class S>
void linear_forward(const Launch& launch, S* y, const S* x, const S* w, const S* b, std::int64_t n,
                    std::int64_t in, std::int64_t out, bool accumulate);
// dx += dy · w;  dw += dyᵀ · x;  db += Σₙ dy.  dx and db may be nullptr.
template <class S>
void linear_backward(const Launch& launch, S* dx, S* dw, S* db, const S* dy, const S* x, const S* w,
                     std::int64_t n, std::int64_t in, std::int64_t out);

// LayerNorm: y = (x − μ)·rstd·w + b; saves mean [n] and rstd [n] (float).
template <class S>
void layernorm_forward(const Launch& launch, S* y, float* mean, float* rstd, const S* x, const S* w,
                       const S* b, std::int64_t n, std::int64_t channels, float eps);
// dx += rstd·(g − mean(g) − x̂·mean(g·x̂)), g = dy·w;  dw += Σₙ dy·x̂;  db += Σₙ dy.
template <class S>
void layernorm_backward(const Launch& launch, S* dx, S* dw, S* db, const S* dy, const S* x,
                        const S* w, const float* mean, const float* rstd, std::int64_t n,
                        std::int64_t channels);

// RMSNorm: y = x·rstd·w, rstd = 1/√(mean(x²) + ε); saves rstd [n] (float).
template <class S>
void rmsnorm_forward(const Launch& launch, S* y, float* rstd, const S* x, const S* w,
                     std::int64_t n, std::int64_t channels, float eps);
// dx += rstd·(g − x̂·mean(g·x̂)), g = dy·w;  dw += Σₙ dy·x̂.
template <class S>
void rmsnorm_backward(const Launch& launch, S* dx, S* dw, const S* dy, const S* x, const S* w,
                      const float* rstd, std::int64_t n, std::int64_t channels);

// Rotary positions, "rotate half" pairing, in place on x [N, heads·d]; angles in double as the
// host's. The backward rotates the gradient back (the inverse rotation).
template <class S>
void rope_forward(const Launch& launch, S* x, std::int64_t batch, std::int64_t seq,
                  std::int64_t heads, std::int64_t head_dim, double theta);
template <class S>
void rope_backward(const Launch& launch, S* dx, std::int64_t batch, std::int64_t seq,
                   std::int64_t heads, std::int64_t head_dim, double theta);

// Causal attention with grouped-query heads, materialized: q, out [N, heads·d]; k, v
// [N, kv_heads·d]; probs [B, heads, T, T] the softmax, zero above the diagonal. out is written.
// In bf16 and f16 the scores Q·Kᵀ are rounded to S before the fp32 softmax reads them, as
// PyTorch's eager attention (a 16-bit matmul, then softmax in fp32, probs cast back to S).
// Throws std::invalid_argument when heads is not a multiple of kv_heads.
template <class S>
void attention_forward(const Launch& launch, S* out, S* probs, const S* q, const S* k, const S* v,
                       std::int64_t batch, std::int64_t seq, std::int64_t heads,
                       std::int64_t kv_heads, std::int64_t head_dim);
// dq += ..., dk += ..., dv += ... (kernels.hpp's formulas). Unlike the host kernel's [T, T],
// scratch holds attention_scratch_elements(batch, seq, heads) = B·heads·T·T elements of S (dP,
// then dS, of every sequence and head at once, so that the GEMMs run batched).
template <class S>
void attention_backward(const Launch& launch, S* dq, S* dk, S* dv, S* scratch, const S* dout,
                        const S* probs, const S* q, const S* k, const S* v, std::int64_t batch,
                        std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                        std::int64_t head_dim);
// Elements attention_backward's scratch must hold: B·heads·T·T.
std::int64_t attention_scratch_elements(std::int64_t batch, std::int64_t seq, std::int64_t heads);

// GELU (tanh approximation) and SwiGLU, element-wise over n; the backward ADDS.
template <class S> void gelu_forward(const Launch& launch, S* out, const S* in, std::int64_t n);
template <class S>
void gelu_backward(const Launch& launch, S* din, const S* in, const S* dout, std::int64_t n);
template <class S>
void swiglu_forward(const Launch& launch, S* out, const S* gate, const S* up, std::int64_t n);
template <class S>
void swiglu_backward(const Launch& launch, S* dgate, S* dup, const S* dout, const S* gate,
                     const S* up, std::int64_t n);

// logp [n, V] (float) = z − max − log Σ exp(z − max), row by row, from logits in S.
template <class S>
void log_softmax_forward(const Launch& launch, float* logp, const S* logits, std::int64_t n,
                         std::int64_t vocab);
// *loss_sum (one double on the device) += Σₙ −logp[n, target[n]], summed in double.
void nll_loss_forward(const Launch& launch, double* loss_sum, const float* logp,
                      const std::int32_t* targets, std::int64_t n, std::int64_t vocab);
// dlogp[n, target[n]] += −scale; the other entries are untouched.
void nll_loss_backward(const Launch& launch, float* dlogp, const std::int32_t* targets,
                       std::int64_t n, std::int64_t vocab, float scale);
// dlogits (S) = dlogp − exp(logp)·Σⱼ dlogp[n, j]: WRITES dlogits.
template <class S>
void log_softmax_backward(const Launch& launch, S* dlogits, const float* dlogp, const float* logp,
                          std::int64_t n, std::int64_t vocab);

// ---- the engine's element-wise work
template <class S>
void copy(const Launch& launch, S* dst, const S* src, std::int64_t n);  // no overlap
template <class S>
void add(const Launch& launch, S* dst, const S* src, std::int64_t n);      // dst += src
void scale(const Launch& launch, float* x, float factor, std::int64_t n);  // x *= factor
// *count += the number of elements of x that are infinite or NaN.
void count_nonfinite(const Launch& launch, int* count, const float* x, std::int64_t n);
// Mixed precision (for S = float, copy and add): the compute copy of the fp32 master weights,
// dst = S(src) rounded to nearest, ties to even (no overlap); and a computed gradient into the
// fp32 master gradients, dst += float(src).
template <class S> void narrow(const Launch& launch, S* dst, const float* src, std::int64_t n);
template <class S> void widen_add(const Launch& launch, float* dst, const S* src, std::int64_t n);

// kernels/adamw.hpp's step on n elements, `step` counting from 1: the scalar factors computed in
// double on the host as adamw.cpp does, the element-wise arithmetic in float in adamw.cpp's order,
// each operation rounded on its own (no fused multiply-add), so a step matches the host's.
// Throws std::invalid_argument when step < 1.
void adamw_step(const Launch& launch, float* params, const float* grads, float* exp_avg,
                float* exp_avg_sq, std::int64_t n, std::int64_t step, double lr, double beta1,
                double beta2, double eps, double weight_decay);

}  // namespace shardplan::kernels::cuda
