// The layer kernels of executor/kernels.hpp on a CUDA device, fp32: the same semantics, the same
// argument order, every pointer a device pointer, `const Launch&` first. Shapes as there:
// activations [N = B·T tokens, C channels] row-major, token n = b·T + t; every backward kernel
// ADDS into the gradients it produces (log_softmax_backward WRITES, as on the host).
//
// Every call queues its work on launch.stream and returns; nothing here synchronizes. Each one
// checks the launch (cudaGetLastError, the cuBLAS status) and throws std::runtime_error with one
// line naming the kernel; sizes of zero queue nothing. The GEMMs go through cuBLAS on launch.blas,
// whose math mode decides fp32 or TF32 (set_tf32).
//
// This header is plain C++ (it is included by host-compiled files): declarations only.
#pragma once

#include <cstdint>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace shardplan::executor::cuda {

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
void embedding_forward(const Launch& launch, float* out, const std::int32_t* tokens,
                       const float* wte, const float* wpe, std::int64_t batch, std::int64_t seq,
                       std::int64_t channels);
// dwte[tokens[n], :] += dout[n, :] (atomically: tokens repeat); dwpe[t, :] += Σ_b dout[b·T + t, :]
// when dwpe is given.
void embedding_backward(const Launch& launch, float* dwte, float* dwpe, const float* dout,
                        const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                        std::int64_t channels);

// y [n, out] (+)= x [n, in] · wᵀ (+ b);  w [out, in] as nn.Linear stores it; accumulate: add to y
// (the GEMM's beta). b may be nullptr.
void linear_forward(const Launch& launch, float* y, const float* x, const float* w, const float* b,
                    std::int64_t n, std::int64_t in, std::int64_t out, bool accumulate);
// dx += dy · w;  dw += dyᵀ · x;  db += Σₙ dy.  dx and db may be nullptr.
void linear_backward(const Launch& launch, float* dx, float* dw, float* db, const float* dy,
                     const float* x, const float* w, std::int64_t n, std::int64_t in,
                     std::int64_t out);

// LayerNorm: y = (x − μ)·rstd·w + b; saves mean [n] and rstd [n].
void layernorm_forward(const Launch& launch, float* y, float* mean, float* rstd, const float* x,
                       const float* w, const float* b, std::int64_t n, std::int64_t channels,
                       float eps);
// dx += rstd·(g − mean(g) − x̂·mean(g·x̂)), g = dy·w;  dw += Σₙ dy·x̂;  db += Σₙ dy.
void layernorm_backward(const Launch& launch, float* dx, float* dw, float* db, const float* dy,
                        const float* x, const float* w, const float* mean, const float* rstd,
                        std::int64_t n, std::int64_t channels);

// RMSNorm: y = x·rstd·w, rstd = 1/√(mean(x²) + ε); saves rstd [n].
void rmsnorm_forward(const Launch& launch, float* y, float* rstd, const float* x, const float* w,
                     std::int64_t n, std::int64_t channels, float eps);
// dx += rstd·(g − x̂·mean(g·x̂)), g = dy·w;  dw += Σₙ dy·x̂.
void rmsnorm_backward(const Launch& launch, float* dx, float* dw, const float* dy, const float* x,
                      const float* w, const float* rstd, std::int64_t n, std::int64_t channels);

// Rotary positions, "rotate half" pairing, in place on x [N, heads·d]; angles in double as the
// host's. The backward rotates the gradient back (the inverse rotation).
void rope_forward(const Launch& launch, float* x, std::int64_t batch, std::int64_t seq,
                  std::int64_t heads, std::int64_t head_dim, double theta);
void rope_backward(const Launch& launch, float* dx, std::int64_t batch, std::int64_t seq,
                   std::int64_t heads, std::int64_t head_dim, double theta);

// Causal attention with grouped-query heads, materialized: q, out [N, heads·d]; k, v
// [N, kv_heads·d]; probs [B, heads, T, T] the softmax, zero above the diagonal. out is written.
// Throws std::invalid_argument when heads is not a multiple of kv_heads.
void attention_forward(const Launch& launch, float* out, float* probs, const float* q,
                       const float* k, const float* v, std::int64_t batch, std::int64_t seq,
                       std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim);
// dq += ..., dk += ..., dv += ... (kernels.hpp's formulas). Unlike the host kernel's [T, T],
// scratch holds attention_scratch_elements(batch, seq, heads) = B·heads·T·T floats (dP, then dS,
// of every sequence and head at once, so that the GEMMs run batched).
void attention_backward(const Launch& launch, float* dq, float* dk, float* dv, float* scratch,
                        const float* dout, const float* probs, const float* q, const float* k,
                        const float* v, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                        std::int64_t kv_heads, std::int64_t head_dim);
// Floats attention_backward's scratch must hold: B·heads·T·T.
std::int64_t attention_scratch_elements(std::int64_t batch, std::int64_t seq, std::int64_t heads);

// GELU (tanh approximation) and SwiGLU, element-wise over n; the backward ADDS.
void gelu_forward(const Launch& launch, float* out, const float* in, std::int64_t n);
void gelu_backward(const Launch& launch, float* din, const float* in, const float* dout,
                   std::int64_t n);
void swiglu_forward(const Launch& launch, float* out, const float* gate, const float* up,
                    std::int64_t n);
void swiglu_backward(const Launch& launch, float* dgate, float* dup, const float* dout,
                     const float* gate, const float* up, std::int64_t n);

// logp [n, V] = z − max − log Σ exp(z − max), row by row.
void log_softmax_forward(const Launch& launch, float* logp, const float* logits, std::int64_t n,
                         std::int64_t vocab);
// *loss_sum (one double on the device) += Σₙ −logp[n, target[n]], summed in double.
void nll_loss_forward(const Launch& launch, double* loss_sum, const float* logp,
                      const std::int32_t* targets, std::int64_t n, std::int64_t vocab);
// dlogp[n, target[n]] += −scale; the other entries are untouched.
void nll_loss_backward(const Launch& launch, float* dlogp, const std::int32_t* targets,
                       std::int64_t n, std::int64_t vocab, float scale);
// dlogits = dlogp − exp(logp)·Σⱼ dlogp[n, j]: WRITES dlogits.
void log_softmax_backward(const Launch& launch, float* dlogits, const float* dlogp,
                          const float* logp, std::int64_t n, std::int64_t vocab);

// ---- the engine's element-wise work
void copy(const Launch& launch, float* dst, const float* src, std::int64_t n);  // no overlap
void add(const Launch& launch, float* dst, const float* src, std::int64_t n);   // dst += src
void scale(const Launch& launch, float* x, float factor, std::int64_t n);       // x *= factor
// *count += the number of elements of x that are infinite or NaN.
void count_nonfinite(const Launch& launch, int* count, const float* x, std::int64_t n);

// executor/adamw.hpp's step on n elements, `step` counting from 1: the scalar factors computed in
// double on the host as adamw.cpp does, the element-wise arithmetic in float in adamw.cpp's order,
// each operation rounded on its own (no fused multiply-add), so a step matches the host's.
// Throws std::invalid_argument when step < 1.
void adamw_step(const Launch& launch, float* params, const float* grads, float* exp_avg,
                float* exp_avg_sq, std::int64_t n, std::int64_t step, double lr, double beta1,
                double beta2, double eps, double weight_decay);

}  // namespace shardplan::executor::cuda
