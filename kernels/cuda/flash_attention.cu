// Over 800 lines: the forward and backward kernels of one algorithm share its tiles, its codecs
// and its launch helpers.
// Causal attention without materialized scores, on CUDA cores (no tensor cores), for storage
// S = float, bf16 or f16: q, k, v, out and the gradients in S, converted to float as they are
// loaded into the shared tiles (which are fp32 in every precision), all arithmetic in fp32, each
// result rounded to S once when stored (to nearest, ties to even); lse and delta are fp32.
// The kernels are templates over the element they read and write, float or a 16-bit word, and a
// Codec that converts it: bf16 and f16 share one set of 16-bit kernels, the format a kernel
// argument (a branch that every thread takes the same way), which halves what the build compiles
// for them.
//
// Forward (FlashAttention-2, Dao 2023, Algorithm 1): one block per (b, head, query tile of Br
// rows). The block keeps its Q tile in shared memory and walks the key/value tiles of Bc rows up
// to the diagonal, holding for each query row the running maximum m, the running sum l of
// exp(s − m) and the unnormalized output; a new tile rescales them by exp(m_old − m_new) (the
// online softmax, FlashAttention, Dao et al. 2022, Algorithm 1, lines 10–12). At the end
// out = acc / l and lse = m + log l. Tiles entirely above the diagonal are never visited.
//
// Backward (FlashAttention-2, Algorithm 2): D = rowsum(dO ∘ O) first (its own kernel), then one
// block per (b, kv head, key tile of B rows). The block keeps its K and V tiles, loops over the
// query heads of its group and over the query tiles at or below the diagonal, recomputes
// P = exp(S − lse), and accumulates dV += Pᵀ·dO and dK += dSᵀ·Q in registers with
// dS = P ∘ (dP − D), dP = dO·Vᵀ. Each key row belongs to exactly one block, so dK and dV are
// added with plain stores at the end. In fp32, dQ += dS·K·scale goes through atomicAdd, since every
// key tile contributes to it. In bf16 and f16 an atomic add would round dQ once per key tile, so a
// third kernel computes dQ instead, one block per (b, head, query tile) as the forward is split:
// it walks the key tiles up to the diagonal, recomputes P and dP (the work of two more GEMMs) and
// keeps dQ in registers, which are added to dq with one rounding at the end (the dQ loop of
// FlashAttention-2's Algorithm 2 as a kernel of its own, as in Triton's fused-attention tutorial).
//
// Thread layout: 4 (8 for the d = 256 backward) consecutive lanes of one warp share one row of a
// tile: in the forward a query row (its scores over the Bc keys, strided by kRowThreads, and its
// output columns, in float4 groups strided by kRowThreads); in the backward a key row (its scores
// against the Br queries, the same striding). The row's reductions are warp shuffles among those
// lanes. Shared tiles have rows padded by 4 floats, which keeps the float4 reads of a warp on
// distinct banks for every supported head dim and keeps rows 16-byte aligned.
//
// Head dims: 16, 32, 64, 80, 96, 128 and 256 in fp32; 64 and 128 in bf16 and f16 (built_for), those
// of every preset model (examples/models: GPT-2, Llama, Mistral), so that the build compiles the
// 16-bit kernels for two head dims rather than seven.
#include "kernels/cuda/flash_attention.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace shardplan::kernels::cuda {

namespace {

// ---- elements

// A bf16 or f16 element as the kernels see it: its 16 bits (kernels::bf16, kernels::f16).
struct Word16 {
  unsigned short bits;
};
static_assert(sizeof(Word16) == sizeof(kernels::bf16) && sizeof(Word16) == sizeof(kernels::f16),
              "a 16-bit element is one word");

// Loads an element as float; stores a float rounded to the element's format (to nearest, ties to
// even): the identity for float.
template <class T> struct Codec;
template <> struct Codec<float> {
  __device__ __forceinline__ float load(float x) const { return x; }
  __device__ __forceinline__ float store(float x) const { return x; }
};
template <> struct Codec<Word16> {
  bool bf16;  // else f16
  __device__ __forceinline__ float load(Word16 x) const {
    return bf16 ? __bfloat162float(__ushort_as_bfloat16(x.bits))
                : __half2float(__ushort_as_half(x.bits));
  }
  __device__ __forceinline__ Word16 store(float x) const {
    return {bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x))
                 : __half_as_ushort(__float2half_rn(x))};
  }
};

template <class T> constexpr bool is_float_v = std::is_same_v<T, float>;

// The kernels' element type of storage S, and its codec.
template <class S> using element_t = std::conditional_t<std::is_same_v<S, float>, float, Word16>;

template <class S> Codec<element_t<S>> codec_of() {
  if constexpr (std::is_same_v<S, float>)
    return {};
  else
    return {std::is_same_v<S, kernels::bf16>};
}

// A pointer to S as a pointer to its element type (const kept).
template <class S> auto elements(S* p) {
  using E = element_t<std::remove_const_t<S>>;
  if constexpr (std::is_const_v<S>)
    return reinterpret_cast<const E*>(p);
  else
    return reinterpret_cast<E*>(p);
}

// The most dynamic shared memory a block may opt into on the smallest device that runs this
// library's sm_80 code: 99 KiB on compute capability 8.6 and 8.9 (163 KiB on 8.0, 227 KiB on 9.0;
// CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"). Without the
// opt-in (cudaFuncSetAttribute) a block gets 48 KiB.
constexpr std::size_t kMaxSharedBytes = 99 * 1024;
constexpr std::size_t kDefaultSharedBytes = 48 * 1024;

// Tile rows per head dim: 32 × 32 up to d = 128, 16 × 16 at d = 256 (which keeps both kernels'
// shared memory under kMaxSharedBytes and the per-thread accumulators at ≤ 64 floats).
template <int D> constexpr int kTileRows = D <= 128 ? 32 : 16;
// Lanes sharing one key row in the backward: its dK and dV accumulators are 2·D / kRowThreads
// floats per lane.
template <int D> constexpr int kBackwardRowThreads = D <= 128 ? 4 : 8;

// Shared memory of the forward, floats:
//   sQ [BR][kStride]   the query tile
//   sK [BC][kStride]   the key tile
//   sV [BC][kStride]   the value tile
//   sP [BR][kPStride]  exp(s − m) of the current key tile, read back by the row's lanes
template <int D, int BR, int BC> struct ForwardLayout {
  static constexpr int kRowThreads = 4;                  // lanes per query row
  static constexpr int kThreads = BR * kRowThreads;      // block size
  static constexpr int kStride = D + 4;                  // floats per Q, K, V tile row
  static constexpr int kPStride = BC + 4;                // floats per P tile row
  static constexpr int kColumns = BC / kRowThreads;      // scores per lane
  static constexpr int kGroups = D / (4 * kRowThreads);  // float4 output groups per lane
  static constexpr std::size_t kFloats =
      static_cast<std::size_t>(BR + 2 * BC) * kStride + static_cast<std::size_t>(BR) * kPStride;
  static constexpr std::size_t kBytes = kFloats * sizeof(float);
  static_assert(D % (4 * kRowThreads) == 0, "a lane's output columns are whole float4 groups");
  static_assert(BC % 4 == 0 && BC % kRowThreads == 0, "P rows are read as float4");
  static_assert(kThreads % 32 == 0, "the shuffles assume whole warps");
  static_assert(kBytes <= kMaxSharedBytes, "forward tiles exceed the shared memory budget");
};

// Shared memory of the backward (BR = BC = B), floats:
//   sK, sV  [B][kStride]   this block's key and value tiles (loaded once)
//   sQ, sdO [B][kStride]   the current query tile and its output gradient
//   sPT     [B][kSStride]  Pᵀ: row = key, column = query
//   sdST    [B][kSStride]  dSᵀ, the same
//   sLse, sDelta [B]       lse and D of the current query rows
template <int D, int B, int TPR> struct BackwardLayout {
  static constexpr int kThreads = B * TPR;       // block size; TPR lanes per key row
  static constexpr int kStride = D + 4;          // floats per K, V, Q, dO tile row
  static constexpr int kSStride = B + TPR;       // floats per Pᵀ, dSᵀ row
  static constexpr int kRows = B / TPR;          // query rows per lane in the score phase
  static constexpr int kGroups = D / (4 * TPR);  // float4 dK, dV, dQ groups per lane
  static constexpr std::size_t kFloats = 4 * static_cast<std::size_t>(B) * kStride +
                                         2 * static_cast<std::size_t>(B) * kSStride + 2 * B;
  static constexpr std::size_t kBytes = kFloats * sizeof(float);
  static_assert(D % (4 * TPR) == 0, "a lane's columns are whole float4 groups");
  static_assert(B % 4 == 0 && B % TPR == 0 && kSStride % 4 == 0, "Pᵀ rows are read as float4");
  static_assert(kThreads % 32 == 0, "the shuffles assume whole warps");
  static_assert(kBytes <= kMaxSharedBytes, "backward tiles exceed the shared memory budget");
};

// Shared memory of the bf16/f16 dQ kernel, floats: the forward's, with the output gradient's tile
// beside the query tile and dS where the forward has P.
//   sQ, sdO [BR][kStride]   the query tile and its output gradient
//   sK, sV  [BC][kStride]   the key and value tiles
//   sdS     [BR][kPStride]  dS of the current key tile, read back by the row's lanes
template <int D, int BR, int BC> struct DqLayout {
  static constexpr int kRowThreads = 4;                  // lanes per query row
  static constexpr int kThreads = BR * kRowThreads;      // block size
  static constexpr int kStride = D + 4;                  // floats per Q, dO, K, V tile row
  static constexpr int kPStride = BC + 4;                // floats per dS tile row
  static constexpr int kColumns = BC / kRowThreads;      // scores per lane
  static constexpr int kGroups = D / (4 * kRowThreads);  // float4 dQ groups per lane
  static constexpr std::size_t kFloats =
      static_cast<std::size_t>(2 * BR + 2 * BC) * kStride + static_cast<std::size_t>(BR) * kPStride;
  static constexpr std::size_t kBytes = kFloats * sizeof(float);
  static_assert(D % (4 * kRowThreads) == 0, "a lane's dQ columns are whole float4 groups");
  static_assert(BC % 4 == 0 && BC % kRowThreads == 0, "dS rows are read as float4");
  static_assert(kThreads % 32 == 0, "the shuffles assume whole warps");
  static_assert(kBytes <= kMaxSharedBytes, "dQ tiles exceed the shared memory budget");
};

__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

__device__ __forceinline__ float dot4(float4 a, float4 b) {
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// acc[0..3] += w · x
__device__ __forceinline__ void axpy4(float* acc, float w, float4 x) {
  acc[0] += w * x.x;
  acc[1] += w * x.y;
  acc[2] += w * x.z;
  acc[3] += w * x.w;
}

// Max and sum over the WIDTH consecutive lanes that share a row (WIDTH a power of two ≤ 32,
// groups aligned to WIDTH, so lane ^ offset stays inside the group).
template <int WIDTH> __device__ __forceinline__ float group_max(float x) {
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

template <int WIDTH> __device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// tile[r][0..D) = src[(row0 + r)·src_stride + 0..D) for r < ROWS (row t of one head starts at
// src + t·src_stride), converted to float; rows at or past `seq` are zeros. Consecutive threads
// read consecutive elements of a row.
template <int D, int ROWS, int STRIDE, int THREADS, class T>
__device__ __forceinline__ void load_rows(float* tile, const T* __restrict__ src,
                                          std::int64_t src_stride, int row0, int seq,
                                          Codec<T> codec) {
  for (int i = static_cast<int>(threadIdx.x); i < ROWS * D; i += THREADS) {
    const int r = i / D, c = i - r * D;
    const int t = row0 + r;
    tile[r * STRIDE + c] = t < seq ? codec.load(src[t * src_stride + c]) : 0.0f;
  }
}

// *p += x, rounded once.
template <class T> __device__ __forceinline__ void add_to(T* p, float x, Codec<T> codec) {
  *p = codec.store(codec.load(*p) + x);
}

// grid (B·heads, ⌈T / BR⌉), block ForwardLayout::kThreads, dynamic shared ForwardLayout::kBytes.
// blockIdx.y counts query tiles from the last one, so the longest blocks (most key tiles) start
// first.
// Left whole: the tile loop keeps its accumulators in registers and its tiles in shared memory;
// split into device functions, that state would pass by reference through every part.
template <class T, int D, int BR, int BC>
__global__ void __launch_bounds__(ForwardLayout<D, BR, BC>::kThreads)
    flash_forward_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
                         const T* __restrict__ k, const T* __restrict__ v, int seq, int heads,
                         int kv_heads, float scale, Codec<T> codec) {
  using L = ForwardLayout<D, BR, BC>;
  constexpr int TPR = L::kRowThreads;
  extern __shared__ __align__(16) float smem[];
  float* sQ = smem;
  float* sK = sQ + BR * L::kStride;
  float* sV = sK + BC * L::kStride;
  float* sP = sV + BC * L::kStride;

  const int b = static_cast<int>(blockIdx.x) / heads;
  const int h = static_cast<int>(blockIdx.x) % heads;
  const int kvh = h / (heads / kv_heads);  // HF repeat_kv: query head h reads kv head h / group
  const int q0 = static_cast<int>(gridDim.y - 1 - blockIdx.y) * BR;
  const int r = static_cast<int>(threadIdx.x) / TPR;    // this lane's query row in the tile
  const int sub = static_cast<int>(threadIdx.x) % TPR;  // its place among the row's lanes
  const int query = q0 + r;

  const std::int64_t q_stride = static_cast<std::int64_t>(heads) * D;  // elements per token, q/out
  const std::int64_t kv_stride = static_cast<std::int64_t>(kv_heads) * D;  // per token, k/v
  const T* qh = q + static_cast<std::int64_t>(b) * seq * q_stride + h * D;
  const T* kh = k + static_cast<std::int64_t>(b) * seq * kv_stride + kvh * D;
  const T* vh = v + static_cast<std::int64_t>(b) * seq * kv_stride + kvh * D;

  load_rows<D, BR, L::kStride, L::kThreads>(sQ, qh, q_stride, q0, seq, codec);

  float acc[L::kGroups][4] = {};  // Σ exp(s − m)·v over the keys so far, columns 4·(sub + TPR·g)
  float m = -INFINITY;            // running maximum of the row's scaled scores
  float l = 0.0f;                 // running Σ exp(s − m)
  // Keys 0 .. the tile's last valid query (causal): key tiles past it are skipped.
  const int last_query = min(q0 + BR, seq) - 1;
  const int kv_tiles = last_query / BC + 1;
  for (int j = 0; j < kv_tiles; ++j) {
    const int k0 = j * BC;
    __syncthreads();  // every lane is done with the previous sK, sV
    load_rows<D, BC, L::kStride, L::kThreads>(sK, kh, kv_stride, k0, seq, codec);
    load_rows<D, BC, L::kStride, L::kThreads>(sV, vh, kv_stride, k0, seq, codec);
    __syncthreads();

    // s[i] = scale · q_query · k_(k0 + sub + TPR·i)
    float s[L::kColumns] = {};
#pragma unroll 4
    for (int c = 0; c < D; c += 4) {
      const float4 qv = load4(sQ + r * L::kStride + c);
#pragma unroll
      for (int i = 0; i < L::kColumns; ++i)
        s[i] += dot4(qv, load4(sK + (sub + TPR * i) * L::kStride + c));
    }
    // Causal mask: key > query scores −∞. Key 0 is never masked, so after the first tile m is
    // finite and exp(m_old − m_new) below is never exp(−∞ + ∞).
    float tile_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < L::kColumns; ++i) {
      const int key = k0 + sub + TPR * i;
      s[i] = key <= query ? s[i] * scale : -INFINITY;
      tile_max = fmaxf(tile_max, s[i]);
    }
    tile_max = group_max<TPR>(tile_max);
    const float m_new = fmaxf(m, tile_max);
    const float rescale = expf(m - m_new);  // 0 on the first tile (m = −∞)
    float tile_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < L::kColumns; ++i) {
      s[i] = expf(s[i] - m_new);  // masked keys: exp(−∞) = 0
      tile_sum += s[i];
    }
    tile_sum = group_sum<TPR>(tile_sum);
    l = l * rescale + tile_sum;
    m = m_new;
#pragma unroll
    for (int g = 0; g < L::kGroups; ++g)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[g][e] *= rescale;

        // acc += p · V_tile: the row's p were computed by its TPR lanes; share them through sP. A
        // row's lanes are one warp's consecutive lanes, so a warp barrier orders the exchange; the
        // next write to sP comes after the __syncthreads at the top of the next tile.
#pragma unroll
    for (int i = 0; i < L::kColumns; ++i) sP[r * L::kPStride + sub + TPR * i] = s[i];
    __syncwarp();
    for (int c = 0; c < BC; c += 4) {
      const float4 p = load4(sP + r * L::kPStride + c);
#pragma unroll
      for (int g = 0; g < L::kGroups; ++g) {
        const int col = 4 * (sub + TPR * g);
        axpy4(acc[g], p.x, load4(sV + (c + 0) * L::kStride + col));
        axpy4(acc[g], p.y, load4(sV + (c + 1) * L::kStride + col));
        axpy4(acc[g], p.z, load4(sV + (c + 2) * L::kStride + col));
        axpy4(acc[g], p.w, load4(sV + (c + 3) * L::kStride + col));
      }
    }
  }

  if (query < seq) {
    const float inv_l = 1.0f / l;
    T* orow = out + (static_cast<std::int64_t>(b) * seq + query) * q_stride + h * D;
#pragma unroll
    for (int g = 0; g < L::kGroups; ++g) {
      const int col = 4 * (sub + TPR * g);
#pragma unroll
      for (int e = 0; e < 4; ++e) orow[col + e] = codec.store(acc[g][e] * inv_l);
    }
    if (sub == 0) lse[(static_cast<std::int64_t>(b) * heads + h) * seq + query] = m + logf(l);
  }
}

// delta[b, h, t] = Σ_c dout[b, t, h, c] · out[b, t, h, c]   (FlashAttention-2's D). One warp per
// row of d elements; rows are numbered as they lie in memory, row = (b·T + t)·heads + h.
constexpr int kDeltaWarps = 8;  // warps per block

template <class T>
__global__ void __launch_bounds__(kDeltaWarps * 32)
    flash_delta_kernel(float* __restrict__ delta, const T* __restrict__ dout,
                       const T* __restrict__ out, std::int64_t rows, int seq, int heads,
                       int head_dim, Codec<T> codec) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kDeltaWarps + threadIdx.x / 32;
  if (row >= rows)  // the same for the whole warp: no lane of it reaches the shuffles
    return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const T* a = dout + row * head_dim;
  const T* o = out + row * head_dim;
  float sum = 0.0f;
  for (int c = lane; c < head_dim; c += 32) sum += codec.load(a[c]) * codec.load(o[c]);
  sum = group_sum<32>(sum);
  if (lane == 0) {
    const std::int64_t token = row / heads;  // b·T + t
    const std::int64_t h = row % heads;
    const std::int64_t b = token / seq, t = token % seq;
    delta[(b * heads + h) * seq + t] = sum;
  }
}

// grid (B·kv_heads, ⌈T / B⌉), block BackwardLayout::kThreads, dynamic shared
// BackwardLayout::kBytes. Block (b, kvh, key tile) owns dK, dV of keys [k0, k0 + B) of kv head
// kvh; it visits the query tiles from its own (the diagonal) to the last, for each query head of
// the group. In fp32 it adds dQ too (atomically); bf16 and f16 leave dq to flash_dq_kernel.
// Left whole: the tile loop keeps its accumulators in registers and its tiles in shared memory;
// split into device functions, that state would pass by reference through every part.
template <class T, int D, int B, int TPR>
__global__ void __launch_bounds__(BackwardLayout<D, B, TPR>::kThreads)
    flash_backward_kernel(T* __restrict__ dq, T* __restrict__ dk, T* __restrict__ dv,
                          const T* __restrict__ dout, const float* __restrict__ lse,
                          const float* __restrict__ delta, const T* __restrict__ q,
                          const T* __restrict__ k, const T* __restrict__ v, int seq, int heads,
                          int kv_heads, float scale, Codec<T> codec) {
  using L = BackwardLayout<D, B, TPR>;
  extern __shared__ __align__(16) float smem[];
  float* sK = smem;
  float* sV = sK + B * L::kStride;
  float* sQ = sV + B * L::kStride;
  float* sdO = sQ + B * L::kStride;
  float* sPT = sdO + B * L::kStride;
  float* sdST = sPT + B * L::kSStride;
  float* sLse = sdST + B * L::kSStride;
  float* sDelta = sLse + B;

  const int b = static_cast<int>(blockIdx.x) / kv_heads;
  const int kvh = static_cast<int>(blockIdx.x) % kv_heads;
  const int group = heads / kv_heads;
  const int tile = static_cast<int>(blockIdx.y);
  const int k0 = tile * B;
  const int c = static_cast<int>(threadIdx.x) / TPR;    // this lane's key row (and dQ row)
  const int sub = static_cast<int>(threadIdx.x) % TPR;  // its place among the row's lanes
  const int key = k0 + c;

  const std::int64_t q_stride = static_cast<std::int64_t>(heads) * D;      // per token, q/dq/dout
  const std::int64_t kv_stride = static_cast<std::int64_t>(kv_heads) * D;  // per token, k/v
  const std::int64_t kv_offset = static_cast<std::int64_t>(b) * seq * kv_stride + kvh * D;
  load_rows<D, B, L::kStride, L::kThreads>(sK, k + kv_offset, kv_stride, k0, seq, codec);
  load_rows<D, B, L::kStride, L::kThreads>(sV, v + kv_offset, kv_stride, k0, seq, codec);

  float dk_acc[L::kGroups][4] = {};  // Σ dS·q over the queries so far (× scale at the end)
  float dv_acc[L::kGroups][4] = {};  // Σ P·dO
  const int q_tiles = (seq + B - 1) / B;
  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    const std::int64_t q_offset = static_cast<std::int64_t>(b) * seq * q_stride + h * D;
    const std::int64_t stat_offset = (static_cast<std::int64_t>(b) * heads + h) * seq;
    // Query tiles before this key tile see none of its keys (all masked): start at the diagonal.
    for (int it = tile; it < q_tiles; ++it) {
      const int q0 = it * B;
      __syncthreads();  // every lane is done with the previous sQ, sdO, sPT, sdST (and sK, sV
                        // are loaded before the first use)
      load_rows<D, B, L::kStride, L::kThreads>(sQ, q + q_offset, q_stride, q0, seq, codec);
      load_rows<D, B, L::kStride, L::kThreads>(sdO, dout + q_offset, q_stride, q0, seq, codec);
      for (int i = static_cast<int>(threadIdx.x); i < B; i += L::kThreads) {
        const int t = q0 + i;
        sLse[i] = t < seq ? lse[stat_offset + t] : 0.0f;
        sDelta[i] = t < seq ? delta[stat_offset + t] : 0.0f;
      }
      __syncthreads();

      // Scores of key `key` against queries r = sub + TPR·i: s = q_r·k, dp = dO_r·v.
      float s[L::kRows] = {};
      float dp[L::kRows] = {};
#pragma unroll 4
      for (int col = 0; col < D; col += 4) {
        const float4 kv = load4(sK + c * L::kStride + col);
        const float4 vv = load4(sV + c * L::kStride + col);
#pragma unroll
        for (int i = 0; i < L::kRows; ++i) {
          const int r = sub + TPR * i;
          s[i] += dot4(load4(sQ + r * L::kStride + col), kv);
          dp[i] += dot4(load4(sdO + r * L::kStride + col), vv);
        }
      }
      // P = exp(scale·s − lse) where key ≤ query < T, else 0 (keys past T then have P = 0 too);
      // dS = P ∘ (dP − D) (softmax backward; FlashAttention-2, Algorithm 2, line 13).
#pragma unroll
      for (int i = 0; i < L::kRows; ++i) {
        const int r = sub + TPR * i;
        const int query = q0 + r;
        const float p = query < seq && key <= query ? expf(s[i] * scale - sLse[r]) : 0.0f;
        sPT[c * L::kSStride + r] = p;
        sdST[c * L::kSStride + r] = p * (dp[i] - sDelta[r]);
      }
      __syncthreads();

      // dV[key] += Σ_r P[r, key]·dO[r];  dK[key] += Σ_r dS[r, key]·Q[r]  (columns of this lane)
      for (int r = 0; r < B; r += 4) {
        const float4 p = load4(sPT + c * L::kSStride + r);
        const float4 ds = load4(sdST + c * L::kSStride + r);
#pragma unroll
        for (int g = 0; g < L::kGroups; ++g) {
          const int col = 4 * (sub + TPR * g);
          axpy4(dv_acc[g], p.x, load4(sdO + (r + 0) * L::kStride + col));
          axpy4(dv_acc[g], p.y, load4(sdO + (r + 1) * L::kStride + col));
          axpy4(dv_acc[g], p.z, load4(sdO + (r + 2) * L::kStride + col));
          axpy4(dv_acc[g], p.w, load4(sdO + (r + 3) * L::kStride + col));
          axpy4(dk_acc[g], ds.x, load4(sQ + (r + 0) * L::kStride + col));
          axpy4(dk_acc[g], ds.y, load4(sQ + (r + 1) * L::kStride + col));
          axpy4(dk_acc[g], ds.z, load4(sQ + (r + 2) * L::kStride + col));
          axpy4(dk_acc[g], ds.w, load4(sQ + (r + 3) * L::kStride + col));
        }
      }

      // dQ[q0 + c] += scale · Σ_j dS[c, j]·K[j]: here the lane's row is query row c of the tile
      // (q0 ≥ k0, so every row of the tile may see keys of this block).
      if constexpr (is_float_v<T>) {
        const int query = q0 + c;
        if (query < seq) {
          float dq_acc[L::kGroups][4] = {};
          for (int j = 0; j < B; ++j) {
            const float ds = sdST[j * L::kSStride + c];
#pragma unroll
            for (int g = 0; g < L::kGroups; ++g)
              axpy4(dq_acc[g], ds, load4(sK + j * L::kStride + 4 * (sub + TPR * g)));
          }
          float* dq_row = dq + q_offset + query * q_stride;
#pragma unroll
          for (int g = 0; g < L::kGroups; ++g) {
            const int col = 4 * (sub + TPR * g);
#pragma unroll
            for (int e = 0; e < 4; ++e) atomicAdd(dq_row + col + e, dq_acc[g][e] * scale);
          }
        }
      }
    }
  }

  if (key < seq) {  // this block alone writes these rows of dK and dV: no atomics needed
    T* dk_row = dk + kv_offset + key * kv_stride;
    T* dv_row = dv + kv_offset + key * kv_stride;
#pragma unroll
    for (int g = 0; g < L::kGroups; ++g) {
      const int col = 4 * (sub + TPR * g);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        add_to(dk_row + col + e, dk_acc[g][e] * scale, codec);
        add_to(dv_row + col + e, dv_acc[g][e], codec);
      }
    }
  }
}

// bf16, f16: dQ += scale · dS·K, dS = P ∘ (dP − D), P = exp(scale·Q·Kᵀ − lse), dP = dO·Vᵀ.
// grid (B·heads, ⌈T / BR⌉), block DqLayout::kThreads, dynamic shared DqLayout::kBytes; the
// forward's split and thread layout: TPR lanes per query row, each with the scores of keys
// sub + TPR·i of the tile and the dQ columns of float4 groups sub + TPR·g. Query tiles are counted
// from the last, as in the forward.
// Left whole: the tile loop keeps its accumulators in registers and its tiles in shared memory;
// split into device functions, that state would pass by reference through every part.
template <class T, int D, int BR, int BC>
__global__ void __launch_bounds__(DqLayout<D, BR, BC>::kThreads)
    flash_dq_kernel(T* __restrict__ dq, const T* __restrict__ dout, const float* __restrict__ lse,
                    const float* __restrict__ delta, const T* __restrict__ q,
                    const T* __restrict__ k, const T* __restrict__ v, int seq, int heads,
                    int kv_heads, float scale, Codec<T> codec) {
  using L = DqLayout<D, BR, BC>;
  constexpr int TPR = L::kRowThreads;
  extern __shared__ __align__(16) float smem[];
  float* sQ = smem;
  float* sdO = sQ + BR * L::kStride;
  float* sK = sdO + BR * L::kStride;
  float* sV = sK + BC * L::kStride;
  float* sdS = sV + BC * L::kStride;

  const int b = static_cast<int>(blockIdx.x) / heads;
  const int h = static_cast<int>(blockIdx.x) % heads;
  const int kvh = h / (heads / kv_heads);
  const int q0 = static_cast<int>(gridDim.y - 1 - blockIdx.y) * BR;
  const int r = static_cast<int>(threadIdx.x) / TPR;    // this lane's query row in the tile
  const int sub = static_cast<int>(threadIdx.x) % TPR;  // its place among the row's lanes
  const int query = q0 + r;

  const std::int64_t q_stride = static_cast<std::int64_t>(heads) * D;      // per token, q/dq/dout
  const std::int64_t kv_stride = static_cast<std::int64_t>(kv_heads) * D;  // per token, k/v
  const std::int64_t q_offset = static_cast<std::int64_t>(b) * seq * q_stride + h * D;
  const std::int64_t kv_offset = static_cast<std::int64_t>(b) * seq * kv_stride + kvh * D;
  load_rows<D, BR, L::kStride, L::kThreads>(sQ, q + q_offset, q_stride, q0, seq, codec);
  load_rows<D, BR, L::kStride, L::kThreads>(sdO, dout + q_offset, q_stride, q0, seq, codec);
  const std::int64_t stat = (static_cast<std::int64_t>(b) * heads + h) * seq + query;
  const float row_lse = query < seq ? lse[stat] : 0.0f;
  const float row_delta = query < seq ? delta[stat] : 0.0f;

  float acc[L::kGroups][4] = {};  // Σ dS·k over the keys so far (× scale at the end)
  const int last_query = min(q0 + BR, seq) - 1;
  const int kv_tiles = last_query / BC + 1;
  for (int j = 0; j < kv_tiles; ++j) {
    const int k0 = j * BC;
    __syncthreads();  // every lane is done with the previous sK, sV, sdS (and sQ, sdO are
                      // loaded before the first use)
    load_rows<D, BC, L::kStride, L::kThreads>(sK, k + kv_offset, kv_stride, k0, seq, codec);
    load_rows<D, BC, L::kStride, L::kThreads>(sV, v + kv_offset, kv_stride, k0, seq, codec);
    __syncthreads();

    // s[i] = q_query · k_(k0 + sub + TPR·i), dp[i] = dO_query · v_(same key)
    float s[L::kColumns] = {};
    float dp[L::kColumns] = {};
#pragma unroll 4
    for (int c = 0; c < D; c += 4) {
      const float4 qv = load4(sQ + r * L::kStride + c);
      const float4 ov = load4(sdO + r * L::kStride + c);
#pragma unroll
      for (int i = 0; i < L::kColumns; ++i) {
        const int row = (sub + TPR * i) * L::kStride + c;
        s[i] += dot4(qv, load4(sK + row));
        dp[i] += dot4(ov, load4(sV + row));
      }
    }
    // P where key ≤ query < T, else 0; dS = P ∘ (dP − D). The row's TPR lanes share dS through
    // sdS (one warp's lanes: a warp barrier orders the exchange).
#pragma unroll
    for (int i = 0; i < L::kColumns; ++i) {
      const int key = k0 + sub + TPR * i;
      const float p = query < seq && key <= query ? expf(s[i] * scale - row_lse) : 0.0f;
      sdS[r * L::kPStride + sub + TPR * i] = p * (dp[i] - row_delta);
    }
    __syncwarp();
    for (int c = 0; c < BC; c += 4) {
      const float4 ds = load4(sdS + r * L::kPStride + c);
#pragma unroll
      for (int g = 0; g < L::kGroups; ++g) {
        const int col = 4 * (sub + TPR * g);
        axpy4(acc[g], ds.x, load4(sK + (c + 0) * L::kStride + col));
        axpy4(acc[g], ds.y, load4(sK + (c + 1) * L::kStride + col));
        axpy4(acc[g], ds.z, load4(sK + (c + 2) * L::kStride + col));
        axpy4(acc[g], ds.w, load4(sK + (c + 3) * L::kStride + col));
      }
    }
  }

  if (query < seq) {
    T* dq_row = dq + q_offset + static_cast<std::int64_t>(query) * q_stride;
#pragma unroll
    for (int g = 0; g < L::kGroups; ++g) {
      const int col = 4 * (sub + TPR * g);
#pragma unroll
      for (int e = 0; e < 4; ++e) add_to(dq_row + col + e, acc[g][e] * scale, codec);
    }
  }
}

// ---- host side

void check(cudaError_t code, const char* kernel, const char* call) {
  if (code != cudaSuccess)
    throw std::runtime_error(std::string(kernel) + ": " + call + " failed: " +
                             cudaGetErrorName(code) + ": " + cudaGetErrorString(code));
}

// Grants `kernel` `bytes` of dynamic shared memory, opting in past the default 48 KiB; throws when
// the current device allows less.
template <class Kernel> void reserve_shared(Kernel kernel, std::size_t bytes, const char* name) {
  if (bytes <= kDefaultSharedBytes) return;
  int device = 0, limit = 0;
  check(cudaGetDevice(&device), name, "cudaGetDevice");
  check(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), name,
        "cudaDeviceGetAttribute");
  if (bytes > static_cast<std::size_t>(limit))
    throw std::runtime_error(std::string(name) + ": needs " + std::to_string(bytes) +
                             " bytes of shared memory per block, device " + std::to_string(device) +
                             " allows " + std::to_string(limit));
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes)),
        name, "cudaFuncSetAttribute");
}

// The head dims each storage type's kernels are built for (the top of this file).
template <class T> constexpr bool built_for(int head_dim) {
  if constexpr (is_float_v<T>)
    return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 80 || head_dim == 96 ||
           head_dim == 128 || head_dim == 256;
  else
    return head_dim == 64 || head_dim == 128;
}

// Calls f(std::integral_constant<int, D>) for a head dim T's kernels are built for.
template <class T, class F> void dispatch_head_dim(std::int64_t head_dim, F&& f) {
  const auto call = [&](auto tag) {
    if constexpr (built_for<T>(decltype(tag)::value)) f(tag);
  };
  switch (head_dim) {
  case 16:
    call(std::integral_constant<int, 16>{});
    break;
  case 32:
    call(std::integral_constant<int, 32>{});
    break;
  case 64:
    call(std::integral_constant<int, 64>{});
    break;
  case 80:
    call(std::integral_constant<int, 80>{});
    break;
  case 96:
    call(std::integral_constant<int, 96>{});
    break;
  case 128:
    call(std::integral_constant<int, 128>{});
    break;
  case 256:
    call(std::integral_constant<int, 256>{});
    break;
  default:
    break;  // rejected by validate()
  }
}

// "16, 32, 64, 80, 96, 128 or 256" for T's kernels.
template <class T> std::string built_head_dims() {
  std::string list;
  const int all[] = {16, 32, 64, 80, 96, 128, 256};
  int left = 0;
  for (const int d : all) left += built_for<T>(d) ? 1 : 0;
  for (const int d : all) {
    if (!built_for<T>(d)) continue;
    --left;
    list += std::to_string(d) + (left > 1 ? ", " : left == 1 ? " or " : "");
  }
  return list;
}

// Rejects what the kernels cannot take, naming the value. True when there is work to queue.
template <class T>
bool validate(const char* name, std::int64_t batch, std::int64_t seq, std::int64_t heads,
              std::int64_t kv_heads, std::int64_t head_dim) {
  auto fail = [&](const std::string& what) {
    throw std::runtime_error(std::string(name) + ": " + what);
  };
  if (batch < 0 || seq < 0)
    fail("batch " + std::to_string(batch) + " and seq " + std::to_string(seq) +
         " must not be negative");
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0)
    fail("heads " + std::to_string(heads) + " must be a positive multiple of kv_heads " +
         std::to_string(kv_heads));
  if (!(head_dim <= 256 && built_for<T>(static_cast<int>(head_dim))))
    fail("head_dim " + std::to_string(head_dim) + " is not supported" +
         (is_float_v<T> ? "" : " in 16 bits") + " (" + built_head_dims<T>() + ")");
  if (batch == 0 || seq == 0) return false;
  // Kernel indices: tokens of one sequence in int; the grid's y (query or key tiles of 16 or 32
  // rows) ≤ 65535, its x (B·heads blocks, B·T·heads / kDeltaWarps blocks) ≤ 2³¹ − 1.
  if (seq > 65535 * 16)
    fail("seq " + std::to_string(seq) + " exceeds " + std::to_string(65535 * 16) +
         " (65535 tiles of 16 rows)");
  if (batch > INT_MAX / heads || batch * heads > INT_MAX / seq * kDeltaWarps)
    fail("batch·heads " + std::to_string(batch * heads) + " exceeds the grid's limit");
  return true;
}

}  // namespace

template <class S> bool flash_attention_supports(std::int64_t head_dim) {
  return head_dim >= 0 && head_dim <= 256 && built_for<element_t<S>>(static_cast<int>(head_dim));
}

template <class S>
void flash_attention_forward(cudaStream_t stream, S* out, float* lse, const S* q, const S* k,
                             const S* v, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                             std::int64_t kv_heads, std::int64_t head_dim) {
  using T = element_t<S>;
  constexpr const char* name = "flash_attention_forward";
  if (!validate<T>(name, batch, seq, heads, kv_heads, head_dim)) return;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  dispatch_head_dim<T>(head_dim, [&](auto tag) {
    constexpr int D = decltype(tag)::value;
    constexpr int R = kTileRows<D>;
    using L = ForwardLayout<D, R, R>;
    reserve_shared(flash_forward_kernel<T, D, R, R>, L::kBytes, name);
    const dim3 grid(static_cast<unsigned>(batch * heads), static_cast<unsigned>((seq + R - 1) / R));
    flash_forward_kernel<T, D, R, R><<<grid, L::kThreads, L::kBytes, stream>>>(
        elements(out), lse, elements(q), elements(k), elements(v), static_cast<int>(seq),
        static_cast<int>(heads), static_cast<int>(kv_heads), scale, codec_of<S>());
  });
  check(cudaGetLastError(), name, "flash_forward_kernel launch");
}

template <class S>
void flash_attention_backward(cudaStream_t stream, S* dq, S* dk, S* dv, float* delta, const S* dout,
                              const S* out, const float* lse, const S* q, const S* k, const S* v,
                              std::int64_t batch, std::int64_t seq, std::int64_t heads,
                              std::int64_t kv_heads, std::int64_t head_dim) {
  using T = element_t<S>;
  constexpr const char* name = "flash_attention_backward";
  if (!validate<T>(name, batch, seq, heads, kv_heads, head_dim)) return;
  const std::int64_t rows = batch * seq * heads;
  const auto delta_blocks = static_cast<unsigned>((rows + kDeltaWarps - 1) / kDeltaWarps);
  flash_delta_kernel<<<delta_blocks, kDeltaWarps * 32, 0, stream>>>(
      delta, elements(dout), elements(out), rows, static_cast<int>(seq), static_cast<int>(heads),
      static_cast<int>(head_dim), codec_of<S>());
  check(cudaGetLastError(), name, "flash_delta_kernel launch");

  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  dispatch_head_dim<T>(head_dim, [&](auto tag) {
    constexpr int D = decltype(tag)::value;
    constexpr int R = kTileRows<D>;
    constexpr int TPR = kBackwardRowThreads<D>;
    using L = BackwardLayout<D, R, TPR>;
    reserve_shared(flash_backward_kernel<T, D, R, TPR>, L::kBytes, name);
    const dim3 grid(static_cast<unsigned>(batch * kv_heads),
                    static_cast<unsigned>((seq + R - 1) / R));
    flash_backward_kernel<T, D, R, TPR><<<grid, L::kThreads, L::kBytes, stream>>>(
        elements(dq), elements(dk), elements(dv), elements(dout), lse, delta, elements(q),
        elements(k), elements(v), static_cast<int>(seq), static_cast<int>(heads),
        static_cast<int>(kv_heads), scale, codec_of<S>());
    check(cudaGetLastError(), name, "flash_backward_kernel launch");
    if constexpr (!is_float_v<T>) {
      using Q = DqLayout<D, R, R>;
      reserve_shared(flash_dq_kernel<T, D, R, R>, Q::kBytes, name);
      const dim3 dq_grid(static_cast<unsigned>(batch * heads),
                         static_cast<unsigned>((seq + R - 1) / R));
      flash_dq_kernel<T, D, R, R><<<dq_grid, Q::kThreads, Q::kBytes, stream>>>(
          elements(dq), elements(dout), lse, delta, elements(q), elements(k), elements(v),
          static_cast<int>(seq), static_cast<int>(heads), static_cast<int>(kv_heads), scale,
          codec_of<S>());
      check(cudaGetLastError(), name, "flash_dq_kernel launch");
    }
  });
}

#define SHARDPLAN_FLASH_ATTENTION(S)                                                               \
  template bool flash_attention_supports<S>(std::int64_t);                                         \
  template void flash_attention_forward<S>(cudaStream_t, S*, float*, const S*, const S*, const S*, \
                                           std::int64_t, std::int64_t, std::int64_t, std::int64_t, \
                                           std::int64_t);                                          \
  template void flash_attention_backward<S>(                                                       \
      cudaStream_t, S*, S*, S*, float*, const S*, const S*, const float*, const S*, const S*,      \
      const S*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t);

SHARDPLAN_FLASH_ATTENTION(float)
SHARDPLAN_FLASH_ATTENTION(kernels::bf16)
SHARDPLAN_FLASH_ATTENTION(kernels::f16)
#undef SHARDPLAN_FLASH_ATTENTION

}  // namespace shardplan::kernels::cuda
