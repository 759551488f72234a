// Over 800 lines: the backend's layer kernels, their launchers and the explicit instantiations
// for the three storage types are one nvcc unit; split, each part would compile the shared device
// helpers again.
// The layer kernels of the GPU backend (device_kernels.hpp), for storage S = float, bf16 or f16.
// The arithmetic of each kernel is that of kernels/kernels.cpp, element by element, in fp32
// whatever S: every load is converted to float (to_float), every store rounded to S once
// (from_float: __float2bfloat16_rn, __float2half_rn; nothing to do for float). What differs from
// the host is only the order of the reductions (warp shuffles instead of a loop) and the GEMMs
// (cuBLAS). The kernels are templates over the CUDA type T of S (float, __nv_bfloat16, __half: the
// same bits as kernels::bf16 and kernels::f16); the launchers, templates over S, cast the
// pointers (dev) and are explicitly instantiated for the three types at the end.
//
// Launch shapes: 256 threads per block everywhere. Element-wise kernels loop grid-stride
// (a grid of at most kMaxGridStrideBlocks blocks). Row reductions give a row to one warp (rows up
// to a few thousand elements: LayerNorm/RMSNorm, the attention softmax) or to one block (the
// vocabulary rows of the loss, up to 128256). Reductions over rows (the gradients of biases and
// norm weights) give 32 columns to a block; in fp32 they split the rows into chunks whose partial
// sums are added with one atomicAdd per column and chunk, in bf16 and f16 one block takes all the
// rows of its columns so that each gradient is rounded once.
//
// Indices are 64-bit: B·heads·T·T passes 2³¹ at T = 4096, and N·V (16384 × 128256) nearly does.
#include "kernels/cuda/device_kernels.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace shardplan::kernels::cuda {
namespace {

constexpr int kThreads = 256;                     // threads per block
constexpr int kWarp = 32;                         // threads per warp
constexpr int kWarpsPerBlock = kThreads / kWarp;  // 8: rows per block of a warp-per-row kernel
constexpr unsigned kFullMask = 0xffffffffu;
constexpr std::int64_t kMaxGridStrideBlocks = 8192;  // ~8 waves of 256-thread blocks on 132 SMs
// Column reductions: blocks of kWarp columns × kColumnPhases row phases; in fp32, enough chunks of
// rows that the grid has about kColumnTargetBlocks blocks, each chunk at least kWarp rows.
constexpr int kColumnPhases = kThreads / kWarp;  // 8
constexpr std::int64_t kColumnTargetBlocks = 2048;

// ---------------------------------------------------------------------------------------------
// Storage types: the CUDA type of each executor type.

template <class S> struct DeviceType {
  using type = S;  // float
};
template <> struct DeviceType<kernels::bf16> { using type = __nv_bfloat16; };
template <> struct DeviceType<kernels::f16> { using type = __half; };
template <class S> using device_t = typename DeviceType<S>::type;

static_assert(sizeof(kernels::bf16) == sizeof(__nv_bfloat16) &&
                  alignof(kernels::bf16) == alignof(__nv_bfloat16),
              "kernels::bf16 has __nv_bfloat16's bits");
static_assert(sizeof(kernels::f16) == sizeof(__half) && alignof(kernels::f16) == alignof(__half),
              "kernels::f16 has __half's bits");

// A pointer to S as its CUDA type (const kept).
template <class S> auto dev(S* p) {
  using T = device_t<std::remove_const_t<S>>;
  if constexpr (std::is_const_v<S>)
    return reinterpret_cast<const T*>(p);
  else
    return reinterpret_cast<T*>(p);
}

template <class T> constexpr bool is_float_v = std::is_same_v<T, float>;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// x rounded to T, to nearest (ties to even).
template <class T> __device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(x);
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(x);
  else
    return x;
}

// *p += x, rounded once.
template <class T> __device__ __forceinline__ void add_to(T* p, float x) {
  *p = from_float<T>(to_float(*p) + x);
}

// ---------------------------------------------------------------------------------------------
// Host-side checks

[[noreturn]] void fail(const char* kernel, const std::string& what) {
  throw std::runtime_error(std::string("cuda::") + kernel + ": " + what);
}

// A kernel launch (or an earlier asynchronous failure, which CUDA reports at the next call).
void check_launch(const char* kernel) {
  const cudaError_t code = cudaGetLastError();
  if (code != cudaSuccess)
    fail(kernel, std::string(cudaGetErrorName(code)) + ": " + cudaGetErrorString(code));
}

void check_cuda(cudaError_t code, const char* kernel) {
  if (code != cudaSuccess)
    fail(kernel, std::string(cudaGetErrorName(code)) + ": " + cudaGetErrorString(code));
}

void check_blas(cublasStatus_t status, const char* kernel) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail(kernel, std::string("cuBLAS: ") + cublasGetStatusString(status));
}

// cuBLAS takes dimensions and leading dimensions as int.
int blas_int(std::int64_t value, const char* kernel, const char* what) {
  if (value > INT_MAX)
    fail(kernel, std::string(what) + " = " + std::to_string(value) + " exceeds cuBLAS's int");
  return static_cast<int>(value);
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Blocks of a grid-stride kernel over n elements (n > 0).
unsigned grid_stride_blocks(std::int64_t n) {
  return static_cast<unsigned>(std::min(ceil_div(n, kThreads), kMaxGridStrideBlocks));
}

// Blocks when each block takes `per_block` items (n > 0); the grid's x dimension is < 2³¹.
unsigned blocks_for(std::int64_t n, std::int64_t per_block, const char* kernel) {
  const std::int64_t blocks = ceil_div(n, per_block);
  if (blocks > INT_MAX) fail(kernel, "too many rows for one grid: " + std::to_string(n));
  return static_cast<unsigned>(blocks);
}

// ---------------------------------------------------------------------------------------------
// Device functions: indices and reductions

__device__ __forceinline__ std::int64_t grid_first() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::int64_t grid_step() {
  return static_cast<std::int64_t>(gridDim.x) * blockDim.x;
}
__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x) % kWarp; }
__device__ __forceinline__ int warp_id() { return static_cast<int>(threadIdx.x) / kWarp; }
// The row of a warp-per-row kernel.
__device__ __forceinline__ std::int64_t warp_row() {
  return static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + warp_id();
}

// Butterfly reductions: every lane gets the result.
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Sum over a block of kThreads threads, returned to every thread; every thread must call it.
// shared: kWarpsPerBlock floats (reusable by the next call).
__device__ float block_sum(float v, float* shared) {
  v = warp_sum(v);
  __syncthreads();  // the previous call's readers are done with `shared`
  if (lane_id() == 0) shared[warp_id()] = v;
  __syncthreads();
  v = lane_id() < kWarpsPerBlock ? shared[lane_id()] : 0.0f;
  return warp_sum(v);
}

// The running maximum m and Σ exp(z − m) of a softmax's normaliser, merged with another part
// (m2, s2) (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax", Alg. 3). An
// empty part has m = −∞, s = 0.
__device__ __forceinline__ void merge_max_sum(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m2 > m) {
    s = s * expf(m - m2) + s2;  // m = −∞ (empty): expf(−∞) = 0 and s = 0
    m = m2;
  } else {
    s += s2 * expf(m2 - m);
  }
}

// ---------------------------------------------------------------------------------------------
// Embedding

// out [N, C]: element i = (n, c).
template <class T>
__global__ void embedding_forward_kernel(T* out, const std::int32_t* tokens, const T* wte,
                                         const T* wpe, std::int64_t seq, std::int64_t channels,
                                         std::int64_t count) {
  for (std::int64_t i = grid_first(); i < count; i += grid_step()) {
    const std::int64_t n = i / channels, c = i % channels;
    float e = to_float(wte[static_cast<std::int64_t>(tokens[n]) * channels + c]);
    if (wpe) e += to_float(wpe[(n % seq) * channels + c]);
    out[i] = from_float<T>(e);
  }
}

// fp32: dwte[tokens[n], c] += dout[n, c]: a token may appear many times in the batch, so
// atomically.
__global__ void embedding_backward_tokens_kernel(float* dwte, const float* dout,
                                                 const std::int32_t* tokens, std::int64_t channels,
                                                 std::int64_t count) {
  for (std::int64_t i = grid_first(); i < count; i += grid_step()) {
    const std::int64_t n = i / channels, c = i % channels;
    atomicAdd(dwte + static_cast<std::int64_t>(tokens[n]) * channels + c, dout[i]);
  }
}

// bf16, f16: dwte[v, :] += Σ_{n: tokens[n] = v} dout[n, :], summed in fp32 and rounded once (a
// 16-bit atomicAdd per row would round at every add, and lose the small terms of a frequent
// token). One block per row n of the batch; only the block of a token's first row works, the
// others see an earlier row of their token and return. That block sums its token's rows in row
// order (the same result every run): each warp scans the rows from n on, 32 tokens at a time, a
// ballot marking the rows of the token, and adds their columns pass + threadIdx.x + kThreads·j
// (kEmbeddingColumns per thread; rows wider than kThreads·kEmbeddingColumns take several passes).
constexpr int kEmbeddingColumns = 4;

template <class T>
__global__ void embedding_backward_rows_kernel(T* dwte, const T* dout, const std::int32_t* tokens,
                                               std::int64_t rows, std::int64_t channels) {
  const std::int64_t n = blockIdx.x;
  const std::int32_t token = tokens[n];
  int earlier = 0;
  for (std::int64_t m = threadIdx.x; m < n; m += kThreads) earlier |= tokens[m] == token ? 1 : 0;
  if (__syncthreads_or(earlier)) return;  // the whole block: no barrier follows
  T* dst = dwte + static_cast<std::int64_t>(token) * channels;
  for (std::int64_t pass = 0; pass < channels;
       pass += static_cast<std::int64_t>(kThreads) * kEmbeddingColumns) {
    // A warp whose columns of this pass all lie past the row's end has nothing to add (the
    // same for the whole warp: its ballots below need every lane).
    if (pass + warp_id() * kWarp >= channels) continue;
    const std::int64_t base = pass + threadIdx.x;
    float sum[kEmbeddingColumns] = {};
    for (std::int64_t first = n; first < rows; first += kWarp) {  // the same for the whole warp
      const std::int64_t m = first + lane_id();
      unsigned match = __ballot_sync(kFullMask, m < rows && tokens[m] == token);
      while (match != 0) {
        const T* src = dout + (first + __ffs(static_cast<int>(match)) - 1) * channels;
        match &= match - 1;
#pragma unroll
        for (int j = 0; j < kEmbeddingColumns; ++j) {
          const std::int64_t c = base + j * kThreads;
          if (c < channels) sum[j] += to_float(src[c]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kEmbeddingColumns; ++j) {
      const std::int64_t c = base + j * kThreads;
      if (c < channels) add_to(dst + c, sum[j]);
    }
  }
}

// dwpe[t, c] += Σ_b dout[b·T + t, c]: one thread per (t, c), no atomics.
template <class T>
__global__ void embedding_backward_positions_kernel(T* dwpe, const T* dout, std::int64_t batch,
                                                    std::int64_t seq, std::int64_t channels) {
  const std::int64_t count = seq * channels;
  for (std::int64_t i = grid_first(); i < count; i += grid_step()) {
    float sum = 0.0f;
    for (std::int64_t b = 0; b < batch; ++b) sum += to_float(dout[b * count + i]);
    add_to(dwpe + i, sum);
  }
}

// ---------------------------------------------------------------------------------------------
// Linear: bias and column sums

// y [rows, cols] += b [cols] on every row; y = b when `overwrite`.
template <class T>
__global__ void add_bias_kernel(T* y, const T* b, std::int64_t cols, std::int64_t count,
                                bool overwrite) {
  for (std::int64_t i = grid_first(); i < count; i += grid_step()) {
    const float bias = to_float(b[i % cols]);
    y[i] = from_float<T>(overwrite ? bias : to_float(y[i]) + bias);
  }
}

// Sums over rows, for the gradients that accumulate across tokens:
//   db[c] += Σ_r dy[r, c]               (db given)
//   dw[c] += Σ_r dy[r, c]·x̂[r, c]       (dw given)
// with x̂ = (x − mean[r])·rstd[r], or x·rstd[r] when mean is nullptr (RMSNorm).
// Block (kWarp, kColumnPhases): threadIdx.x a column (coalesced rows), threadIdx.y a phase of the
// rows; blockIdx.x picks 32 columns, blockIdx.y a chunk of rows_per_chunk rows. In fp32 each block
// adds its chunk's sum of each column with one atomicAdd; in bf16 and f16 there is one chunk (the
// launch's), and the block adds its sums with one rounding.
template <class T>
__global__ void column_sums_kernel(T* dw, T* db, const T* dy, const T* x, const float* mean,
                                   const float* rstd, std::int64_t rows, std::int64_t cols,
                                   std::int64_t rows_per_chunk) {
  __shared__ float part_w[kColumnPhases][kWarp + 1];  // +1: no bank conflicts on the reads below
  __shared__ float part_b[kColumnPhases][kWarp + 1];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kWarp + threadIdx.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.y) * rows_per_chunk;
  const std::int64_t last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
  float sum_w = 0.0f, sum_b = 0.0f;
  if (c < cols)
    for (std::int64_t r = first + threadIdx.y; r < last; r += kColumnPhases) {
      const float d = to_float(dy[r * cols + c]);
      sum_b += d;
      if (dw) {
        const float xv = to_float(x[r * cols + c]);
        const float centred = mean ? xv - mean[r] : xv;
        sum_w += d * (centred * rstd[r]);
      }
    }
  part_w[threadIdx.y][threadIdx.x] = sum_w;
  part_b[threadIdx.y][threadIdx.x] = sum_b;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total_w = 0.0f, total_b = 0.0f;
    for (int phase = 0; phase < kColumnPhases; ++phase) {
      total_w += part_w[phase][threadIdx.x];
      total_b += part_b[phase][threadIdx.x];
    }
    if constexpr (is_float_v<T>) {
      if (dw) atomicAdd(dw + c, total_w);
      if (db) atomicAdd(db + c, total_b);
    } else {
      if (dw) add_to(dw + c, total_w);
      if (db) add_to(db + c, total_b);
    }
  }
}

template <class T>
void launch_column_sums(const Launch& launch, const char* kernel, T* dw, T* db, const T* dy,
                        const T* x, const float* mean, const float* rstd, std::int64_t rows,
                        std::int64_t cols) {
  const std::int64_t column_blocks = ceil_div(cols, kWarp);
  if (column_blocks > INT_MAX) fail(kernel, "too many columns: " + std::to_string(cols));
  std::int64_t rows_per_chunk = rows;  // bf16, f16: one chunk
  if constexpr (is_float_v<T>) {
    const std::int64_t wanted =
        std::max<std::int64_t>(1, ceil_div(kColumnTargetBlocks, column_blocks));
    const std::int64_t chunks_at_most = std::min(wanted, ceil_div(rows, kWarp));
    rows_per_chunk = ceil_div(rows, chunks_at_most);
  }
  const std::int64_t chunks = ceil_div(rows, rows_per_chunk);  // no empty chunk
  const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(chunks));
  const dim3 block(kWarp, kColumnPhases);
  column_sums_kernel<T>
      <<<grid, block, 0, launch.stream>>>(dw, db, dy, x, mean, rstd, rows, cols, rows_per_chunk);
  check_launch(kernel);
}

// ---------------------------------------------------------------------------------------------
// GEMMs. cuBLAS is column-major: a row-major [r, c] matrix with row stride ld is, to cuBLAS, its
// transpose, a c × r matrix with leading dimension ld. So a row-major product Y = X·Wᵀ is asked
// for as Yᵀ = W·Xᵀ (llm.c matmul_forward_cublaslt makes the same mapping). fp32 goes through
// cublasSgemm (the handle's math mode: fp32 or TF32); bf16 and f16 through cublasGemmEx with
// CUBLAS_COMPUTE_32F (fp32 products and sums, alpha and beta in float, C rounded once to 16 bits).

template <class T>
constexpr cudaDataType_t kBlasType = std::is_same_v<T, __nv_bfloat16> ? CUDA_R_16BF : CUDA_R_16F;

// C = op(A)·op(B) + beta·C in cuBLAS's column-major terms; m × n = op(A) m × k times op(B) k × n.
template <class T>
void gemm(const Launch& launch, const char* kernel, cublasOperation_t op_a, cublasOperation_t op_b,
          int m, int n, int k, const T* a, int lda, const T* b, int ldb, float beta, T* c,
          int ldc) {
  const float alpha = 1.0f;
  if constexpr (is_float_v<T>)
    check_blas(cublasSgemm(launch.blas, op_a, op_b, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc),
               kernel);
  else
    check_blas(cublasGemmEx(launch.blas, op_a, op_b, m, n, k, &alpha, a, kBlasType<T>, lda, b,
                            kBlasType<T>, ldb, &beta, c, kBlasType<T>, ldc, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
               kernel);
}

// The same over `batch` matrices at the given element strides.
template <class T>
void gemm_batched(const Launch& launch, const char* kernel, cublasOperation_t op_a,
                  cublasOperation_t op_b, int m, int n, int k, const T* a, int lda,
                  long long stride_a, const T* b, int ldb, long long stride_b, float beta, T* c,
                  int ldc, long long stride_c, int batch) {
  const float alpha = 1.0f;
  if constexpr (is_float_v<T>)
    check_blas(cublasSgemmStridedBatched(launch.blas, op_a, op_b, m, n, k, &alpha, a, lda, stride_a,
                                         b, ldb, stride_b, &beta, c, ldc, stride_c, batch),
               kernel);
  else
    check_blas(cublasGemmStridedBatchedEx(launch.blas, op_a, op_b, m, n, k, &alpha, a, kBlasType<T>,
                                          lda, stride_a, b, kBlasType<T>, ldb, stride_b, &beta, c,
                                          kBlasType<T>, ldc, stride_c, batch, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT),
               kernel);
}

// ---------------------------------------------------------------------------------------------
// LayerNorm and RMSNorm: one warp per row; the statistics in fp32 as on the host (two passes for
// the variance, the biased one of torch.nn.LayerNorm).

template <class T>
__global__ void layernorm_forward_kernel(T* y, float* mean, float* rstd, const T* x, const T* w,
                                         const T* b, std::int64_t rows, std::int64_t channels,
                                         float eps) {
  const std::int64_t row = warp_row();
  if (row >= rows) return;  // the whole warp: no block-level synchronization below
  const int lane = lane_id();
  const float inv_c = 1.0f / static_cast<float>(channels);
  const T* xr = x + row * channels;
  float sum = 0.0f;
  for (std::int64_t c = lane; c < channels; c += kWarp) sum += to_float(xr[c]);
  const float m = warp_sum(sum) * inv_c;
  float sq = 0.0f;
  for (std::int64_t c = lane; c < channels; c += kWarp) {
    const float d = to_float(xr[c]) - m;
    sq += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(sq) * inv_c + eps);
  T* yr = y + row * channels;
  for (std::int64_t c = lane; c < channels; c += kWarp)
    yr[c] = from_float<T>((to_float(xr[c]) - m) * r * to_float(w[c]) + (b ? to_float(b[c]) : 0.0f));
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dx += rstd·(g − mean(g) − x̂·mean(g·x̂)), g = dy·w (llm.c layernorm_backward).
template <class T>
__global__ void layernorm_backward_dx_kernel(T* dx, const T* dy, const T* x, const T* w,
                                             const float* mean, const float* rstd,
                                             std::int64_t rows, std::int64_t channels) {
  const std::int64_t row = warp_row();
  if (row >= rows) return;
  const int lane = lane_id();
  const float inv_c = 1.0f / static_cast<float>(channels);
  const T* dyr = dy + row * channels;
  const T* xr = x + row * channels;
  const float m = mean[row], r = rstd[row];
  float g_sum = 0.0f, gx_sum = 0.0f;
  for (std::int64_t c = lane; c < channels; c += kWarp) {
    const float xhat = (to_float(xr[c]) - m) * r;
    const float g = to_float(dyr[c]) * to_float(w[c]);
    g_sum += g;
    gx_sum += g * xhat;
  }
  const float g_mean = warp_sum(g_sum) * inv_c, gx_mean = warp_sum(gx_sum) * inv_c;
  T* dxr = dx + row * channels;
  for (std::int64_t c = lane; c < channels; c += kWarp) {
    const float xhat = (to_float(xr[c]) - m) * r;
    const float g = to_float(dyr[c]) * to_float(w[c]);
    add_to(dxr + c, r * (g - g_mean - xhat * gx_mean));
  }
}

template <class T>
__global__ void rmsnorm_forward_kernel(T* y, float* rstd, const T* x, const T* w, std::int64_t rows,
                                       std::int64_t channels, float eps) {
  const std::int64_t row = warp_row();
  if (row >= rows) return;
  const int lane = lane_id();
  const float inv_c = 1.0f / static_cast<float>(channels);
  const T* xr = x + row * channels;
  float sq = 0.0f;
  for (std::int64_t c = lane; c < channels; c += kWarp) {
    const float xv = to_float(xr[c]);
    sq += xv * xv;
  }
  const float r = 1.0f / sqrtf(warp_sum(sq) * inv_c + eps);
  T* yr = y + row * channels;
  for (std::int64_t c = lane; c < channels; c += kWarp)
    yr[c] = from_float<T>(to_float(xr[c]) * r * to_float(w[c]));
  if (lane == 0) rstd[row] = r;
}

// dx += rstd·(g − x̂·mean(g·x̂)), g = dy·w, x̂ = x·rstd.
template <class T>
__global__ void rmsnorm_backward_dx_kernel(T* dx, const T* dy, const T* x, const T* w,
                                           const float* rstd, std::int64_t rows,
                                           std::int64_t channels) {
  const std::int64_t row = warp_row();
  if (row >= rows) return;
  const int lane = lane_id();
  const float inv_c = 1.0f / static_cast<float>(channels);
  const T* dyr = dy + row * channels;
  const T* xr = x + row * channels;
  const float r = rstd[row];
  float gx_sum = 0.0f;
  for (std::int64_t c = lane; c < channels; c += kWarp)
    gx_sum += to_float(dyr[c]) * to_float(w[c]) * to_float(xr[c]) * r;
  const float gx_mean = warp_sum(gx_sum) * inv_c;
  T* dxr = dx + row * channels;
  for (std::int64_t c = lane; c < channels; c += kWarp) {
    const float xhat = to_float(xr[c]) * r;
    add_to(dxr + c, r * (to_float(dyr[c]) * to_float(w[c]) - xhat * gx_mean));
  }
}

// ---------------------------------------------------------------------------------------------
// Rotary positions (RoFormer eq. 34, HF "rotate half" pairing: channel i with i + d/2).
// Thread (t, i) of the x dimension computes cos/sin of t·θ^(−2i/d) once, in double as the host
// does, then rotates that pair in the (sequence, head)s of blockIdx.y, blockIdx.y + gridDim.y, ...
// x [B, T, heads, d]; direction +1 (forward) or −1 (the inverse rotation, the backward).

// cos and sin of the angle t·θ^(−2i/d) of pair (t, i), in double as the host computes them, then
// rounded to float; sin negated for direction −1. Not inlined: one copy of double pow and sincos
// serves the rope kernel of every storage type.
__device__ __noinline__ float2 rope_cos_sin(std::int64_t t, std::int64_t i, std::int64_t head_dim,
                                            double theta, double direction) {
  const double inv_freq = pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  const double angle = static_cast<double>(t) * inv_freq;
  double sin_angle, cos_angle;
  sincos(angle, &sin_angle, &cos_angle);
  return make_float2(static_cast<float>(cos_angle), static_cast<float>(direction * sin_angle));
}

template <class T>
__global__ void rope_kernel(T* x, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                            std::int64_t batch_heads, double theta, double direction) {
  const std::int64_t half = head_dim / 2;
  const std::int64_t pair = grid_first();
  if (pair >= seq * half) return;
  const std::int64_t t = pair / half, i = pair % half;
  const float2 rotation = rope_cos_sin(t, i, head_dim, theta, direction);
  const float c = rotation.x, s = rotation.y;
  for (std::int64_t bh = blockIdx.y; bh < batch_heads; bh += gridDim.y) {
    const std::int64_t b = bh / heads, h = bh % heads;
    T* p = x + ((b * seq + t) * heads + h) * head_dim;
    const float x1 = to_float(p[i]), x2 = to_float(p[i + half]);
    p[i] = from_float<T>(x1 * c - x2 * s);
    p[i + half] = from_float<T>(x2 * c + x1 * s);
  }
}

template <class T>
void launch_rope(const Launch& launch, const char* kernel, T* x, std::int64_t batch,
                 std::int64_t seq, std::int64_t heads, std::int64_t head_dim, double theta,
                 double direction) {
  const std::int64_t pairs = seq * (head_dim / 2), batch_heads = batch * heads;
  if (pairs == 0 || batch_heads == 0) return;
  // Each thread rotates its pair in at most 8 (sequence, head)s, so the double-precision
  // cos/sin is paid once per 8 rotations.
  constexpr std::int64_t kRotationsPerThread = 8;
  const dim3 grid(blocks_for(pairs, kThreads, kernel),
                  static_cast<unsigned>(
                      std::min<std::int64_t>(ceil_div(batch_heads, kRotationsPerThread), 65535)));
  rope_kernel<T><<<grid, kThreads, 0, launch.stream>>>(x, seq, heads, head_dim, batch_heads, theta,
                                                       direction);
  check_launch(kernel);
}

// ---------------------------------------------------------------------------------------------
// Attention's softmax, one warp per row of scores [B·heads·T rows, T]: row r is query t = r mod T,
// keys 0..t kept (causal), the rest set to zero.

// In place: raw scores Q·Kᵀ in, probabilities out. p = exp(s·scale − max·scale) / Σ, as the host;
// the last pass computes exp again from the raw score (the same value), so that a 16-bit p is
// rounded once.
template <class T>
__global__ void causal_softmax_kernel(T* probs, std::int64_t rows, std::int64_t seq, float scale) {
  const std::int64_t row = warp_row();
  if (row >= rows) return;
  const int lane = lane_id();
  const std::int64_t t = row % seq;
  T* p = probs + row * seq;
  float maxv = -INFINITY;
  for (std::int64_t j = lane; j <= t; j += kWarp) maxv = fmaxf(maxv, to_float(p[j]));
  maxv = warp_max(maxv) * scale;
  float sum = 0.0f;
  for (std::int64_t j = lane; j <= t; j += kWarp) sum += expf(to_float(p[j]) * scale - maxv);
  const float inv_sum = 1.0f / warp_sum(sum);
  for (std::int64_t j = lane; j < seq; j += kWarp)
    p[j] = from_float<T>(j <= t ? expf(to_float(p[j]) * scale - maxv) * inv_sum : 0.0f);
}

// In place on dp: dP in, dS = P ∘ (dP − Σⱼ P·dP)·scale out (zero above the diagonal).
template <class T>
__global__ void causal_softmax_backward_kernel(T* dp, const T* probs, std::int64_t rows,
                                               std::int64_t seq, float scale) {
  const std::int64_t row = warp_row();
  if (row >= rows) return;
  const int lane = lane_id();
  const std::int64_t t = row % seq;
  const T* p = probs + row * seq;
  T* d = dp + row * seq;
  float dot = 0.0f;
  for (std::int64_t j = lane; j <= t; j += kWarp) dot += to_float(p[j]) * to_float(d[j]);
  dot = warp_sum(dot);
  for (std::int64_t j = lane; j < seq; j += kWarp)
    d[j] = from_float<T>(j <= t ? to_float(p[j]) * (to_float(d[j]) - dot) * scale : 0.0f);
}

// The layout of one attention call for the batched GEMMs. For sequence b and j ∈ [0, G),
// G = heads / kv_heads, the query heads h = g·G + j (g ∈ [0, kv_heads)) read kv head g (HF
// repeat_kv), so one strided-batched GEMM covers them: q/out/dq advance by G·d per g, k/v/dk/dv
// by d, probs/scratch by G·T·T.
struct AttentionShape {
  int seq, head_dim, q_ld, kv_ld, kv_heads;  // q_ld = heads·d, kv_ld = kv_heads·d (row strides)
  std::int64_t heads, group;
  long long q_stride, kv_stride, scores_stride;  // per g: G·d, d, G·T·T

  AttentionShape(std::int64_t t, std::int64_t h, std::int64_t kv, std::int64_t d,
                 const char* kernel) {
    if (h % kv != 0)
      throw std::invalid_argument(std::string("cuda::") + kernel + ": heads " + std::to_string(h) +
                                  " is not a multiple of kv_heads " + std::to_string(kv));
    seq = blas_int(t, kernel, "T");
    head_dim = blas_int(d, kernel, "head_dim");
    q_ld = blas_int(h * d, kernel, "heads·head_dim");
    kv_ld = blas_int(kv * d, kernel, "kv_heads·head_dim");
    kv_heads = blas_int(kv, kernel, "kv_heads");
    heads = h;
    group = h / kv;
    q_stride = group * d;
    kv_stride = d;
    scores_stride = group * t * t;
  }
  // Offsets, in elements, of sequence b's first query head j, and of its first kv head.
  std::int64_t q_offset(std::int64_t b, std::int64_t j) const {
    return b * seq * static_cast<std::int64_t>(q_ld) + j * head_dim;
  }
  std::int64_t kv_offset(std::int64_t b) const {
    return b * seq * static_cast<std::int64_t>(kv_ld);
  }
  // probs/scratch of (b, head j): [B, heads, T, T].
  std::int64_t scores_offset(std::int64_t b, std::int64_t j) const {
    return (b * heads + j) * seq * static_cast<std::int64_t>(seq);
  }
};

// S = Q·Kᵀ (row-major [T, T] per head) as cuBLAS's Sᵀ = K·Qᵀ: op(A) = K (T × d; A is k's
// column-major d × T view, transposed), op(B) = Qᵀ (q's d × T view).
// Reused for dP = dO·Vᵀ with (q, k) := (dO, V).
template <class T>
void scores_gemm(const Launch& launch, const char* kernel, const AttentionShape& s, const T* q,
                 const T* k, T* scores) {
  gemm_batched(launch, kernel, CUBLAS_OP_T, CUBLAS_OP_N, s.seq, s.seq, s.head_dim, k, s.kv_ld,
               s.kv_stride, q, s.q_ld, s.q_stride, 0.0f, scores, s.seq, s.scores_stride,
               s.kv_heads);
}

// O (+)= P·V (row-major [T, d] per query head, row stride heads·d) as Oᵀ = Vᵀ·Pᵀ: op(A) = Vᵀ
// (v's d × T view), op(B) = Pᵀ (p's column-major T × T view). Reused for dQ += dS·K.
template <class T>
void apply_gemm(const Launch& launch, const char* kernel, const AttentionShape& s, const T* p,
                const T* v, float beta, T* out) {
  gemm_batched(launch, kernel, CUBLAS_OP_N, CUBLAS_OP_N, s.head_dim, s.seq, s.seq, v, s.kv_ld,
               s.kv_stride, p, s.seq, s.scores_stride, beta, out, s.q_ld, s.q_stride, s.kv_heads);
}

// dV += Pᵀ·dO (row-major [T, d] per kv head, row stride kv_heads·d) as dVᵀ = dOᵀ·P: op(A) = dOᵀ
// (dO's d × T view), op(B) = P (the transpose of p's column-major view). Reused for dK += dSᵀ·Q.
// The G query heads of a kv head add into it in G calls issued in order on one stream.
template <class T>
void apply_transposed_gemm(const Launch& launch, const char* kernel, const AttentionShape& s,
                           const T* p, const T* dout, T* dv) {
  gemm_batched(launch, kernel, CUBLAS_OP_N, CUBLAS_OP_T, s.head_dim, s.seq, s.seq, dout, s.q_ld,
               s.q_stride, p, s.seq, s.scores_stride, 1.0f, dv, s.kv_ld, s.kv_stride, s.kv_heads);
}

// ---------------------------------------------------------------------------------------------
// GELU (tanh approximation, GPT-2's gelu_new) and SwiGLU, element-wise.

constexpr float kGeluScale = 0.7978845608028654f;  // √(2/π)
constexpr float kGeluCubic = 0.044715f;

template <class T> __global__ void gelu_forward_kernel(T* out, const T* in, std::int64_t n) {
  for (std::int64_t i = grid_first(); i < n; i += grid_step()) {
    const float x = to_float(in[i]);
    out[i] = from_float<T>(0.5f * x * (1.0f + tanhf(kGeluScale * (x + kGeluCubic * x * x * x))));
  }
}

template <class T>
__global__ void gelu_backward_kernel(T* din, const T* in, const T* dout, std::int64_t n) {
  for (std::int64_t i = grid_first(); i < n; i += grid_step()) {
    const float x = to_float(in[i]);
    const float th = tanhf(kGeluScale * (x + kGeluCubic * x * x * x));
    const float sech2 = 1.0f - th * th;
    const float local =
        0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    add_to(din + i, local * to_float(dout[i]));
  }
}

template <class T>
__global__ void swiglu_forward_kernel(T* out, const T* gate, const T* up, std::int64_t n) {
  for (std::int64_t i = grid_first(); i < n; i += grid_step()) {
    const float g = to_float(gate[i]);
    const float sig = 1.0f / (1.0f + expf(-g));
    out[i] = from_float<T>(g * sig * to_float(up[i]));
  }
}

template <class T>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up,
                                       std::int64_t n) {
  for (std::int64_t i = grid_first(); i < n; i += grid_step()) {
    const float g = to_float(gate[i]);
    const float sig = 1.0f / (1.0f + expf(-g));
    const float d = to_float(dout[i]);
    add_to(dgate + i, d * to_float(up[i]) * sig * (1.0f + g * (1.0f - sig)));
    add_to(dup + i, d * g * sig);
  }
}

// ---------------------------------------------------------------------------------------------
// The loss (torch's log_softmax and nll_loss), one block per vocabulary row. The logits and their
// gradient are in S; the log-probabilities and their gradient in fp32.

// logp = z − (max + log Σ exp(z − max)); max and Σ in one pass (online normaliser), then a
// second pass writes.
template <class T>
__global__ void log_softmax_forward_kernel(float* logp, const T* logits, std::int64_t vocab) {
  __shared__ float part_max[kWarpsPerBlock], part_sum[kWarpsPerBlock];
  __shared__ float shift;
  const std::int64_t row = blockIdx.x;
  const T* z = logits + row * vocab;
  float m = -INFINITY, s = 0.0f;
  for (std::int64_t j = threadIdx.x; j < vocab; j += kThreads)
    merge_max_sum(m, s, to_float(z[j]), 1.0f);
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const float m2 = __shfl_xor_sync(kFullMask, m, offset);
    const float s2 = __shfl_xor_sync(kFullMask, s, offset);
    merge_max_sum(m, s, m2, s2);
  }
  if (lane_id() == 0) {
    part_max[warp_id()] = m;
    part_sum[warp_id()] = s;
  }
  __syncthreads();
  if (warp_id() == 0) {
    m = lane_id() < kWarpsPerBlock ? part_max[lane_id()] : -INFINITY;
    s = lane_id() < kWarpsPerBlock ? part_sum[lane_id()] : 0.0f;
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      const float m2 = __shfl_xor_sync(kFullMask, m, offset);
      const float s2 = __shfl_xor_sync(kFullMask, s, offset);
      merge_max_sum(m, s, m2, s2);
    }
    if (lane_id() == 0) shift = m + logf(s);
  }
  __syncthreads();
  const float row_shift = shift;
  float* out = logp + row * vocab;
  for (std::int64_t j = threadIdx.x; j < vocab; j += kThreads) out[j] = to_float(z[j]) - row_shift;
}

// *loss_sum += Σₙ −logp[n, target[n]] in double: one block, so the sum is added by one thread
// after the work queued before it (no atomics; the same order every run).
__global__ void nll_loss_forward_kernel(double* loss_sum, const float* logp,
                                        const std::int32_t* targets, std::int64_t n,
                                        std::int64_t vocab) {
  __shared__ double part[kWarpsPerBlock];
  double sum = 0.0;
  for (std::int64_t i = threadIdx.x; i < n; i += kThreads)
    sum -= static_cast<double>(logp[i * vocab + targets[i]]);
  sum = warp_sum(sum);
  if (lane_id() == 0) part[warp_id()] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kWarpsPerBlock; ++w) total += part[w];
    *loss_sum += total;
  }
}

// dlogp[n, target[n]] −= scale: one element per row, so no two threads touch the same one.
__global__ void nll_loss_backward_kernel(float* dlogp, const std::int32_t* targets, std::int64_t n,
                                         std::int64_t vocab, float scale) {
  for (std::int64_t i = grid_first(); i < n; i += grid_step())
    dlogp[i * vocab + targets[i]] -= scale;
}

// dlogits = dlogp − exp(logp)·Σⱼ dlogp (torch's _log_softmax_backward_data); writes.
template <class T>
__global__ void log_softmax_backward_kernel(T* dlogits, const float* dlogp, const float* logp,
                                            std::int64_t vocab) {
  __shared__ float part[kWarpsPerBlock];
  const std::int64_t row = blockIdx.x;
  const float* g = dlogp + row * vocab;
  const float* lp = logp + row * vocab;
  float sum = 0.0f;
  for (std::int64_t j = threadIdx.x; j < vocab; j += kThreads) sum += g[j];
  sum = block_sum(sum, part);
  T* out = dlogits + row * vocab;
  for (std::int64_t j = threadIdx.x; j < vocab; j += kThreads)
    out[j] = from_float<T>(g[j] - expf(lp[j]) * sum);
}

// ---------------------------------------------------------------------------------------------
// Element-wise work of the engine, and AdamW

template <class T> __global__ void add_kernel(T* dst, const T* src, std::int64_t n) {
  for (std::int64_t i = grid_first(); i < n; i += grid_step()) add_to(dst + i, to_float(src[i]));
}

// dst = T(src): the compute copy of fp32 master weights.
template <class T> __global__ void narrow_kernel(T* dst, const float* src, std::int64_t n) {
  for (std::int64_t i = grid_first(); i < n; i += grid_step()) dst[i] = from_float<T>(src[i]);
}

// dst += float(src): a computed gradient into the fp32 master gradients.
template <class T> __global__ void widen_add_kernel(float* dst, const T* src, std::int64_t n) {
  for (std::int64_t i = grid_first(); i < n; i += grid_step()) dst[i] += to_float(src[i]);
}

__global__ void scale_kernel(float* x, float factor, std::int64_t n) {
  for (std::int64_t i = grid_first(); i < n; i += grid_step()) x[i] *= factor;
}

__global__ void count_nonfinite_kernel(int* count, const float* x, std::int64_t n) {
  int bad = 0;
  for (std::int64_t i = grid_first(); i < n; i += grid_step()) bad += isfinite(x[i]) ? 0 : 1;
  if (bad > 0) atomicAdd(count, bad);
}

// torch.optim.AdamW's element-wise update in adamw.cpp's order (see adamw.hpp):
//   θ ← θ·decay;  m ← m + (1 − β₁)·(g − m);  v ← β₂·v + ((1 − β₂)·g)·g;
//   θ ← θ − (step_size·m) / (√v / √(1 − β₂ᵗ) + ε).
// The _rn intrinsics round every operation on its own: the compiler may not fuse them into FMAs,
// so the update is the host's, operation for operation.
__global__ void adamw_kernel(float* params, const float* grads, float* exp_avg, float* exp_avg_sq,
                             std::int64_t n, float decay, float one_minus_beta1, float beta2,
                             float one_minus_beta2, float step_size, float bias_correction2_sqrt,
                             float eps) {
  for (std::int64_t i = grid_first(); i < n; i += grid_step()) {
    const float g = grads[i];
    const float p = __fmul_rn(params[i], decay);
    const float m = __fadd_rn(exp_avg[i], __fmul_rn(one_minus_beta1, __fsub_rn(g, exp_avg[i])));
    const float v =
        __fadd_rn(__fmul_rn(beta2, exp_avg_sq[i]), __fmul_rn(__fmul_rn(one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), bias_correction2_sqrt), eps);
    params[i] = __fsub_rn(p, __fdiv_rn(__fmul_rn(step_size, m), denom));
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Launchers: templates over S; dev() gives the kernels their CUDA type.

void set_tf32(cublasHandle_t blas, bool enabled) {
  check_blas(cublasSetMathMode(blas, enabled ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
             "set_tf32");
}

template <class S>
void embedding_forward(const Launch& launch, S* out, const std::int32_t* tokens, const S* wte,
                       const S* wpe, std::int64_t batch, std::int64_t seq, std::int64_t channels) {
  const std::int64_t count = batch * seq * channels;
  if (count == 0) return;
  embedding_forward_kernel<<<grid_stride_blocks(count), kThreads, 0, launch.stream>>>(
      dev(out), tokens, dev(wte), dev(wpe), seq, channels, count);
  check_launch("embedding_forward");
}

template <class S>
void embedding_backward(const Launch& launch, S* dwte, S* dwpe, const S* dout,
                        const std::int32_t* tokens, std::int64_t batch, std::int64_t seq,
                        std::int64_t channels) {
  constexpr const char* kernel = "embedding_backward";
  const std::int64_t count = batch * seq * channels;
  if (count == 0) return;
  if constexpr (std::is_same_v<S, float>)
    embedding_backward_tokens_kernel<<<grid_stride_blocks(count), kThreads, 0, launch.stream>>>(
        dwte, dout, tokens, channels, count);
  else
    embedding_backward_rows_kernel<<<blocks_for(batch * seq, 1, kernel), kThreads, 0,
                                     launch.stream>>>(dev(dwte), dev(dout), tokens, batch * seq,
                                                      channels);
  check_launch(kernel);
  if (!dwpe) return;
  embedding_backward_positions_kernel<<<grid_stride_blocks(seq * channels), kThreads, 0,
                                        launch.stream>>>(dev(dwpe), dev(dout), batch, seq,
                                                         channels);
  check_launch(kernel);
}

template <class S>
void linear_forward(const Launch& launch, S* y, const S* x, const S* w, const S* b, std::int64_t n,
                    std::int64_t in, std::int64_t out, bool accumulate) {
  constexpr const char* kernel = "linear_forward";
  if (n == 0 || out == 0) return;
  const auto add_bias = [&](bool overwrite) {
    add_bias_kernel<<<grid_stride_blocks(n * out), kThreads, 0, launch.stream>>>(
        dev(y), dev(b), out, n * out, overwrite);
    check_launch(kernel);
  };
  // bf16, f16: the bias goes into y first (b is in S: exactly, when not accumulating) and the
  // GEMM adds to it, so that y is rounded once (as cuBLASLt's bias epilogue and PyTorch's addmm).
  const bool bias_first = b != nullptr && !std::is_same_v<S, float>;
  if (bias_first) add_bias(!accumulate);
  if (in > 0) {
    // Yᵀ [out × n] = W [out × in] · Xᵀ [in × n]: w's column-major view is Wᵀ (in × out, ld in),
    // transposed; x's is Xᵀ (in × n, ld in); y's is Yᵀ (out × n, ld out).
    gemm(launch, kernel, CUBLAS_OP_T, CUBLAS_OP_N, blas_int(out, kernel, "out"),
         blas_int(n, kernel, "n"), blas_int(in, kernel, "in"), dev(w), blas_int(in, kernel, "in"),
         dev(x), blas_int(in, kernel, "in"), accumulate || bias_first ? 1.0f : 0.0f, dev(y),
         blas_int(out, kernel, "out"));
  } else if (!accumulate && !bias_first) {
    check_cuda(cudaMemsetAsync(y, 0, static_cast<std::size_t>(n * out) * sizeof(S), launch.stream),
               kernel);  // an empty sum
  }
  if (b && !bias_first) add_bias(false);
}

template <class S>
void linear_backward(const Launch& launch, S* dx, S* dw, S* db, const S* dy, const S* x, const S* w,
                     std::int64_t n, std::int64_t in, std::int64_t out) {
  constexpr const char* kernel = "linear_backward";
  if (n == 0 || out == 0) return;
  if (in > 0) {
    const int n_ = blas_int(n, kernel, "n"), in_ = blas_int(in, kernel, "in"),
              out_ = blas_int(out, kernel, "out");
    // dXᵀ [in × n] += Wᵀ [in × out] · dYᵀ [out × n]: both are their arrays' column-major views.
    if (dx)
      gemm(launch, kernel, CUBLAS_OP_N, CUBLAS_OP_N, in_, n_, out_, dev(w), in_, dev(dy), out_,
           1.0f, dev(dx), in_);
    // dWᵀ [in × out] += Xᵀ [in × n] · dY [n × out]: x's view, and dy's view (dYᵀ) transposed.
    gemm(launch, kernel, CUBLAS_OP_N, CUBLAS_OP_T, in_, out_, n_, dev(x), in_, dev(dy), out_, 1.0f,
         dev(dw), in_);
  }
  if (db)
    launch_column_sums(launch, kernel, dev(static_cast<S*>(nullptr)), dev(db), dev(dy),
                       dev(static_cast<const S*>(nullptr)), nullptr, nullptr, n, out);
}

template <class S>
void layernorm_forward(const Launch& launch, S* y, float* mean, float* rstd, const S* x, const S* w,
                       const S* b, std::int64_t n, std::int64_t channels, float eps) {
  constexpr const char* kernel = "layernorm_forward";
  if (n == 0 || channels == 0) return;
  layernorm_forward_kernel<<<blocks_for(n, kWarpsPerBlock, kernel), kThreads, 0, launch.stream>>>(
      dev(y), mean, rstd, dev(x), dev(w), dev(b), n, channels, eps);
  check_launch(kernel);
}

template <class S>
void layernorm_backward(const Launch& launch, S* dx, S* dw, S* db, const S* dy, const S* x,
                        const S* w, const float* mean, const float* rstd, std::int64_t n,
                        std::int64_t channels) {
  constexpr const char* kernel = "layernorm_backward";
  if (n == 0 || channels == 0) return;
  layernorm_backward_dx_kernel<<<blocks_for(n, kWarpsPerBlock, kernel), kThreads, 0,
                                 launch.stream>>>(dev(dx), dev(dy), dev(x), dev(w), mean, rstd, n,
                                                  channels);
  check_launch(kernel);
  launch_column_sums(launch, kernel, dev(dw), dev(db), dev(dy), dev(x), mean, rstd, n, channels);
}

template <class S>
void rmsnorm_forward(const Launch& launch, S* y, float* rstd, const S* x, const S* w,
                     std::int64_t n, std::int64_t channels, float eps) {
  constexpr const char* kernel = "rmsnorm_forward";
  if (n == 0 || channels == 0) return;
  rmsnorm_forward_kernel<<<blocks_for(n, kWarpsPerBlock, kernel), kThreads, 0, launch.stream>>>(
      dev(y), rstd, dev(x), dev(w), n, channels, eps);
  check_launch(kernel);
}

template <class S>
void rmsnorm_backward(const Launch& launch, S* dx, S* dw, const S* dy, const S* x, const S* w,
                      const float* rstd, std::int64_t n, std::int64_t channels) {
  constexpr const char* kernel = "rmsnorm_backward";
  if (n == 0 || channels == 0) return;
  rmsnorm_backward_dx_kernel<<<blocks_for(n, kWarpsPerBlock, kernel), kThreads, 0, launch.stream>>>(
      dev(dx), dev(dy), dev(x), dev(w), rstd, n, channels);
  check_launch(kernel);
  launch_column_sums(launch, kernel, dev(dw), dev(static_cast<S*>(nullptr)), dev(dy), dev(x),
                     nullptr, rstd, n, channels);
}

template <class S>
void rope_forward(const Launch& launch, S* x, std::int64_t batch, std::int64_t seq,
                  std::int64_t heads, std::int64_t head_dim, double theta) {
  launch_rope(launch, "rope_forward", dev(x), batch, seq, heads, head_dim, theta, 1.0);
}

// The rotation is orthogonal: the gradient of its input is Rᵀ·dy = R(−angle)·dy.
template <class S>
void rope_backward(const Launch& launch, S* dx, std::int64_t batch, std::int64_t seq,
                   std::int64_t heads, std::int64_t head_dim, double theta) {
  launch_rope(launch, "rope_backward", dev(dx), batch, seq, heads, head_dim, theta, -1.0);
}

std::int64_t attention_scratch_elements(std::int64_t batch, std::int64_t seq, std::int64_t heads) {
  return batch * heads * seq * seq;
}

// Vaswani et al. 2017 eq. 1, causal: P = softmax(Q·Kᵀ/√d) (masked), O = P·V.
template <class S>
void attention_forward(const Launch& launch, S* out, S* probs, const S* q, const S* k, const S* v,
                       std::int64_t batch, std::int64_t seq, std::int64_t heads,
                       std::int64_t kv_heads, std::int64_t head_dim) {
  constexpr const char* kernel = "attention_forward";
  if (batch == 0 || seq == 0 || heads == 0 || kv_heads == 0 || head_dim == 0) return;
  const AttentionShape s(seq, heads, kv_heads, head_dim, kernel);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t j = 0; j < s.group; ++j)
      scores_gemm(launch, kernel, s, dev(q + s.q_offset(b, j)), dev(k + s.kv_offset(b)),
                  dev(probs + s.scores_offset(b, j)));
  const std::int64_t rows = batch * heads * seq;
  causal_softmax_kernel<<<blocks_for(rows, kWarpsPerBlock, kernel), kThreads, 0, launch.stream>>>(
      dev(probs), rows, seq, scale);
  check_launch(kernel);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t j = 0; j < s.group; ++j)
      apply_gemm(launch, kernel, s, dev(probs + s.scores_offset(b, j)), dev(v + s.kv_offset(b)),
                 0.0f, dev(out + s.q_offset(b, j)));
}

// dP = dO·Vᵀ; dV += Pᵀ·dO; dS = P ∘ (dP − rowsum(P ∘ dP))·scale; dQ += dS·K; dK += dSᵀ·Q.
template <class S>
void attention_backward(const Launch& launch, S* dq, S* dk, S* dv, S* scratch, const S* dout,
                        const S* probs, const S* q, const S* k, const S* v, std::int64_t batch,
                        std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                        std::int64_t head_dim) {
  constexpr const char* kernel = "attention_backward";
  if (batch == 0 || seq == 0 || heads == 0 || kv_heads == 0 || head_dim == 0) return;
  const AttentionShape s(seq, heads, kv_heads, head_dim, kernel);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t j = 0; j < s.group; ++j) {
      const S* dout_bj = dout + s.q_offset(b, j);
      scores_gemm(launch, kernel, s, dev(dout_bj), dev(v + s.kv_offset(b)),
                  dev(scratch + s.scores_offset(b, j)));
      apply_transposed_gemm(launch, kernel, s, dev(probs + s.scores_offset(b, j)), dev(dout_bj),
                            dev(dv + s.kv_offset(b)));
    }
  const std::int64_t rows = batch * heads * seq;
  causal_softmax_backward_kernel<<<blocks_for(rows, kWarpsPerBlock, kernel), kThreads, 0,
                                   launch.stream>>>(dev(scratch), dev(probs), rows, seq, scale);
  check_launch(kernel);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t j = 0; j < s.group; ++j) {
      const S* ds_bj = scratch + s.scores_offset(b, j);
      apply_gemm(launch, kernel, s, dev(ds_bj), dev(k + s.kv_offset(b)), 1.0f,
                 dev(dq + s.q_offset(b, j)));
      apply_transposed_gemm(launch, kernel, s, dev(ds_bj), dev(q + s.q_offset(b, j)),
                            dev(dk + s.kv_offset(b)));
    }
}

template <class S> void gelu_forward(const Launch& launch, S* out, const S* in, std::int64_t n) {
  if (n == 0) return;
  gelu_forward_kernel<<<grid_stride_blocks(n), kThreads, 0, launch.stream>>>(dev(out), dev(in), n);
  check_launch("gelu_forward");
}

template <class S>
void gelu_backward(const Launch& launch, S* din, const S* in, const S* dout, std::int64_t n) {
  if (n == 0) return;
  gelu_backward_kernel<<<grid_stride_blocks(n), kThreads, 0, launch.stream>>>(dev(din), dev(in),
                                                                              dev(dout), n);
  check_launch("gelu_backward");
}

template <class S>
void swiglu_forward(const Launch& launch, S* out, const S* gate, const S* up, std::int64_t n) {
  if (n == 0) return;
  swiglu_forward_kernel<<<grid_stride_blocks(n), kThreads, 0, launch.stream>>>(dev(out), dev(gate),
                                                                               dev(up), n);
  check_launch("swiglu_forward");
}

template <class S>
void swiglu_backward(const Launch& launch, S* dgate, S* dup, const S* dout, const S* gate,
                     const S* up, std::int64_t n) {
  if (n == 0) return;
  swiglu_backward_kernel<<<grid_stride_blocks(n), kThreads, 0, launch.stream>>>(
      dev(dgate), dev(dup), dev(dout), dev(gate), dev(up), n);
  check_launch("swiglu_backward");
}

template <class S>
void log_softmax_forward(const Launch& launch, float* logp, const S* logits, std::int64_t n,
                         std::int64_t vocab) {
  constexpr const char* kernel = "log_softmax_forward";
  if (n == 0 || vocab == 0) return;
  log_softmax_forward_kernel<<<blocks_for(n, 1, kernel), kThreads, 0, launch.stream>>>(
      logp, dev(logits), vocab);
  check_launch(kernel);
}

void nll_loss_forward(const Launch& launch, double* loss_sum, const float* logp,
                      const std::int32_t* targets, std::int64_t n, std::int64_t vocab) {
  if (n == 0 || vocab == 0) return;
  nll_loss_forward_kernel<<<1, kThreads, 0, launch.stream>>>(loss_sum, logp, targets, n, vocab);
  check_launch("nll_loss_forward");
}

void nll_loss_backward(const Launch& launch, float* dlogp, const std::int32_t* targets,
                       std::int64_t n, std::int64_t vocab, float scale) {
  if (n == 0 || vocab == 0) return;
  nll_loss_backward_kernel<<<grid_stride_blocks(n), kThreads, 0, launch.stream>>>(dlogp, targets, n,
                                                                                  vocab, scale);
  check_launch("nll_loss_backward");
}

template <class S>
void log_softmax_backward(const Launch& launch, S* dlogits, const float* dlogp, const float* logp,
                          std::int64_t n, std::int64_t vocab) {
  constexpr const char* kernel = "log_softmax_backward";
  if (n == 0 || vocab == 0) return;
  log_softmax_backward_kernel<<<blocks_for(n, 1, kernel), kThreads, 0, launch.stream>>>(
      dev(dlogits), dlogp, logp, vocab);
  check_launch(kernel);
}

template <class S> void copy(const Launch& launch, S* dst, const S* src, std::int64_t n) {
  if (n == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(S),
                             cudaMemcpyDeviceToDevice, launch.stream),
             "copy");
}

template <class S> void add(const Launch& launch, S* dst, const S* src, std::int64_t n) {
  if (n == 0) return;
  add_kernel<<<grid_stride_blocks(n), kThreads, 0, launch.stream>>>(dev(dst), dev(src), n);
  check_launch("add");
}

template <class S> void narrow(const Launch& launch, S* dst, const float* src, std::int64_t n) {
  if constexpr (std::is_same_v<S, float>) {
    copy(launch, dst, src, n);
  } else {
    if (n == 0) return;
    narrow_kernel<<<grid_stride_blocks(n), kThreads, 0, launch.stream>>>(dev(dst), src, n);
    check_launch("narrow");
  }
}

template <class S> void widen_add(const Launch& launch, float* dst, const S* src, std::int64_t n) {
  if constexpr (std::is_same_v<S, float>) {
    add(launch, dst, src, n);
  } else {
    if (n == 0) return;
    widen_add_kernel<<<grid_stride_blocks(n), kThreads, 0, launch.stream>>>(dst, dev(src), n);
    check_launch("widen_add");
  }
}

void scale(const Launch& launch, float* x, float factor, std::int64_t n) {
  if (n == 0) return;
  scale_kernel<<<grid_stride_blocks(n), kThreads, 0, launch.stream>>>(x, factor, n);
  check_launch("scale");
}

void count_nonfinite(const Launch& launch, int* count, const float* x, std::int64_t n) {
  if (n == 0) return;
  count_nonfinite_kernel<<<grid_stride_blocks(n), kThreads, 0, launch.stream>>>(count, x, n);
  check_launch("count_nonfinite");
}

void adamw_step(const Launch& launch, float* params, const float* grads, float* exp_avg,
                float* exp_avg_sq, std::int64_t n, std::int64_t step, double lr, double beta1,
                double beta2, double eps, double weight_decay) {
  if (step < 1)
    throw std::invalid_argument("cuda::adamw_step: step " + std::to_string(step) + " < 1");
  if (n == 0) return;
  // The scalar factors exactly as adamw.cpp computes them: in double, then rounded to float.
  const double t = static_cast<double>(step);
  const float decay = static_cast<float>(1.0 - lr * weight_decay);
  const float one_minus_beta1 = static_cast<float>(1.0 - beta1);
  const float beta2_f = static_cast<float>(beta2);
  const float one_minus_beta2 = static_cast<float>(1.0 - beta2);
  const float step_size = static_cast<float>(lr / (1.0 - std::pow(beta1, t)));
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, t)));
  const float eps_f = static_cast<float>(eps);
  adamw_kernel<<<grid_stride_blocks(n), kThreads, 0, launch.stream>>>(
      params, grads, exp_avg, exp_avg_sq, n, decay, one_minus_beta1, beta2_f, one_minus_beta2,
      step_size, bias_correction2_sqrt, eps_f);
  check_launch("adamw_step");
}

// ---------------------------------------------------------------------------------------------
// The instantiations: every templated launcher for S = float, bf16, f16.

#define SHARDPLAN_DEVICE_KERNELS(S)                                                                \
  template void embedding_forward<S>(const Launch&, S*, const std::int32_t*, const S*, const S*,   \
                                     std::int64_t, std::int64_t, std::int64_t);                    \
  template void embedding_backward<S>(const Launch&, S*, S*, const S*, const std::int32_t*,        \
                                      std::int64_t, std::int64_t, std::int64_t);                   \
  template void linear_forward<S>(const Launch&, S*, const S*, const S*, const S*, std::int64_t,   \
                                  std::int64_t, std::int64_t, bool);                               \
  template void linear_backward<S>(const Launch&, S*, S*, S*, const S*, const S*, const S*,        \
                                   std::int64_t, std::int64_t, std::int64_t);                      \
  template void layernorm_forward<S>(const Launch&, S*, float*, float*, const S*, const S*,        \
                                     const S*, std::int64_t, std::int64_t, float);                 \
  template void layernorm_backward<S>(const Launch&, S*, S*, S*, const S*, const S*, const S*,     \
                                      const float*, const float*, std::int64_t, std::int64_t);     \
  template void rmsnorm_forward<S>(const Launch&, S*, float*, const S*, const S*, std::int64_t,    \
                                   std::int64_t, float);                                           \
  template void rmsnorm_backward<S>(const Launch&, S*, S*, const S*, const S*, const S*,           \
                                    const float*, std::int64_t, std::int64_t);                     \
  template void rope_forward<S>(const Launch&, S*, std::int64_t, std::int64_t, std::int64_t,       \
                                std::int64_t, double);                                             \
  template void rope_backward<S>(const Launch&, S*, std::int64_t, std::int64_t, std::int64_t,      \
                                 std::int64_t, double);                                            \
  template void attention_forward<S>(const Launch&, S*, S*, const S*, const S*, const S*,          \
                                     std::int64_t, std::int64_t, std::int64_t, std::int64_t,       \
                                     std::int64_t);                                                \
  template void attention_backward<S>(const Launch&, S*, S*, S*, S*, const S*, const S*, const S*, \
                                      const S*, const S*, std::int64_t, std::int64_t,              \
                                      std::int64_t, std::int64_t, std::int64_t);                   \
  template void gelu_forward<S>(const Launch&, S*, const S*, std::int64_t);                        \
  template void gelu_backward<S>(const Launch&, S*, const S*, const S*, std::int64_t);             \
  template void swiglu_forward<S>(const Launch&, S*, const S*, const S*, std::int64_t);            \
  template void swiglu_backward<S>(const Launch&, S*, S*, const S*, const S*, const S*,            \
                                   std::int64_t);                                                  \
  template void log_softmax_forward<S>(const Launch&, float*, const S*, std::int64_t,              \
                                       std::int64_t);                                              \
  template void log_softmax_backward<S>(const Launch&, S*, const float*, const float*,             \
                                        std::int64_t, std::int64_t);                               \
  template void copy<S>(const Launch&, S*, const S*, std::int64_t);                                \
  template void add<S>(const Launch&, S*, const S*, std::int64_t);                                 \
  template void narrow<S>(const Launch&, S*, const float*, std::int64_t);                          \
  template void widen_add<S>(const Launch&, float*, const S*, std::int64_t);

SHARDPLAN_DEVICE_KERNELS(float)
SHARDPLAN_DEVICE_KERNELS(kernels::bf16)
SHARDPLAN_DEVICE_KERNELS(kernels::f16)
#undef SHARDPLAN_DEVICE_KERNELS

}  // namespace shardplan::kernels::cuda
