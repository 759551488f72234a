// Causal attention without materialized scores, fp32 on CUDA cores (no tensor cores).
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
// added with plain stores at the end; dQ += dS·K·scale goes through atomicAdd, since every key
// tile contributes to it.
//
// Thread layout: 4 (8 for the d = 256 backward) consecutive lanes of one warp share one row of a
// tile: in the forward a query row (its scores over the Bc keys, strided by kRowThreads, and its
// output columns, in float4 groups strided by kRowThreads); in the backward a key row (its scores
// against the Br queries, the same striding). The row's reductions are warp shuffles among those
// lanes. Shared tiles have rows padded by 4 floats, which keeps the float4 reads of a warp on
// distinct banks for every supported head dim and keeps rows 16-byte aligned.
#include "executor/cuda/flash_attention.hpp"

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace shardplan::executor::cuda {

namespace {

// The most dynamic shared memory a block may opt into on the smallest device that runs this
// library's sm_80 code: 99 KiB on compute capability 8.6 and 8.9 (163 KiB on 8.0, 227 KiB on 9.0;
// CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"). Without the
// opt-in (cudaFuncSetAttribute) a block gets 48 KiB.
constexpr std::size_t kMaxSharedBytes = 99 * 1024;
constexpr std::size_t kDefaultSharedBytes = 48 * 1024;

// Tile rows per head dim: 32 × 32 up to d = 128, 16 × 16 at d = 256 (which keeps both kernels'
// shared memory under kMaxSharedBytes and the per-thread accumulators at ≤ 64 floats).
template <int D>
constexpr int kTileRows = D <= 128 ? 32 : 16;
// Lanes sharing one key row in the backward: its dK and dV accumulators are 2·D / kRowThreads
// floats per lane.
template <int D>
constexpr int kBackwardRowThreads = D <= 128 ? 4 : 8;

// Shared memory of the forward, floats:
//   sQ [BR][kStride]   the query tile
//   sK [BC][kStride]   the key tile
//   sV [BC][kStride]   the value tile
//   sP [BR][kPStride]  exp(s − m) of the current key tile, read back by the row's lanes
template <int D, int BR, int BC>
struct ForwardLayout {
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
template <int D, int B, int TPR>
struct BackwardLayout {
  static constexpr int kThreads = B * TPR;          // block size; TPR lanes per key row
  static constexpr int kStride = D + 4;             // floats per K, V, Q, dO tile row
  static constexpr int kSStride = B + TPR;          // floats per Pᵀ, dSᵀ row
  static constexpr int kRows = B / TPR;             // query rows per lane in the score phase
  static constexpr int kGroups = D / (4 * TPR);     // float4 dK, dV, dQ groups per lane
  static constexpr std::size_t kFloats = 4 * static_cast<std::size_t>(B) * kStride +
                                         2 * static_cast<std::size_t>(B) * kSStride + 2 * B;
  static constexpr std::size_t kBytes = kFloats * sizeof(float);
  static_assert(D % (4 * TPR) == 0, "a lane's columns are whole float4 groups");
  static_assert(B % 4 == 0 && B % TPR == 0 && kSStride % 4 == 0, "Pᵀ rows are read as float4");
  static_assert(kThreads % 32 == 0, "the shuffles assume whole warps");
  static_assert(kBytes <= kMaxSharedBytes, "backward tiles exceed the shared memory budget");
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
template <int WIDTH>
__device__ __forceinline__ float group_max(float x) {
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

template <int WIDTH>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// tile[r][0..D) = src[(row0 + r)·src_stride + 0..D) for r < ROWS (row t of one head starts at
// src + t·src_stride); rows at or past `seq` are zeros. Consecutive threads read consecutive
// floats of a row.
template <int D, int ROWS, int STRIDE, int THREADS>
__device__ __forceinline__ void load_rows(float* tile, const float* __restrict__ src,
                                          std::int64_t src_stride, int row0, int seq) {
  for (int i = static_cast<int>(threadIdx.x); i < ROWS * D; i += THREADS) {
    const int r = i / D, c = i - r * D;
    const int t = row0 + r;
    tile[r * STRIDE + c] = t < seq ? src[t * src_stride + c] : 0.0f;
  }
}

// grid (B·heads, ⌈T / BR⌉), block ForwardLayout::kThreads, dynamic shared ForwardLayout::kBytes.
// blockIdx.y counts query tiles from the last one, so the longest blocks (most key tiles) start
// first.
template <int D, int BR, int BC>
__global__ void __launch_bounds__(ForwardLayout<D, BR, BC>::kThreads)
flash_forward_kernel(float* __restrict__ out, float* __restrict__ lse, const float* __restrict__ q,
                     const float* __restrict__ k, const float* __restrict__ v, int seq, int heads,
                     int kv_heads, float scale) {
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

  const std::int64_t q_stride = static_cast<std::int64_t>(heads) * D;  // floats per token, q/out
  const std::int64_t kv_stride = static_cast<std::int64_t>(kv_heads) * D;  // floats per token, k/v
  const float* qh = q + static_cast<std::int64_t>(b) * seq * q_stride + h * D;
  const float* kh = k + static_cast<std::int64_t>(b) * seq * kv_stride + kvh * D;
  const float* vh = v + static_cast<std::int64_t>(b) * seq * kv_stride + kvh * D;

  load_rows<D, BR, L::kStride, L::kThreads>(sQ, qh, q_stride, q0, seq);

  float acc[L::kGroups][4] = {};  // Σ exp(s − m)·v over the keys so far, columns 4·(sub + TPR·g)
  float m = -INFINITY;            // running maximum of the row's scaled scores
  float l = 0.0f;                 // running Σ exp(s − m)
  // Keys 0 .. the tile's last valid query (causal): key tiles past it are skipped.
  const int last_query = min(q0 + BR, seq) - 1;
  const int kv_tiles = last_query / BC + 1;
  for (int j = 0; j < kv_tiles; ++j) {
    const int k0 = j * BC;
    __syncthreads();  // every lane is done with the previous sK, sV
    load_rows<D, BC, L::kStride, L::kThreads>(sK, kh, kv_stride, k0, seq);
    load_rows<D, BC, L::kStride, L::kThreads>(sV, vh, kv_stride, k0, seq);
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
    float* orow = out + (static_cast<std::int64_t>(b) * seq + query) * q_stride + h * D;
#pragma unroll
    for (int g = 0; g < L::kGroups; ++g) {
      const int col = 4 * (sub + TPR * g);
#pragma unroll
      for (int e = 0; e < 4; ++e) orow[col + e] = acc[g][e] * inv_l;
    }
    if (sub == 0)
      lse[(static_cast<std::int64_t>(b) * heads + h) * seq + query] = m + logf(l);
  }
}

// delta[b, h, t] = Σ_c dout[b, t, h, c] · out[b, t, h, c]   (FlashAttention-2's D). One warp per
// row of d floats; rows are numbered as they lie in memory, row = (b·T + t)·heads + h.
constexpr int kDeltaWarps = 8;  // warps per block

__global__ void __launch_bounds__(kDeltaWarps * 32)
flash_delta_kernel(float* __restrict__ delta, const float* __restrict__ dout,
                   const float* __restrict__ out, std::int64_t rows, int seq, int heads,
                   int head_dim) {
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kDeltaWarps + threadIdx.x / 32;
  if (row >= rows)  // the same for the whole warp: no lane of it reaches the shuffles
    return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const float* a = dout + row * head_dim;
  const float* o = out + row * head_dim;
  float sum = 0.0f;
  for (int c = lane; c < head_dim; c += 32) sum += a[c] * o[c];
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
// the group.
template <int D, int B, int TPR>
__global__ void __launch_bounds__(BackwardLayout<D, B, TPR>::kThreads)
flash_backward_kernel(float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv,
                      const float* __restrict__ dout, const float* __restrict__ lse,
                      const float* __restrict__ delta, const float* __restrict__ q,
                      const float* __restrict__ k, const float* __restrict__ v, int seq,
                      int heads, int kv_heads, float scale) {
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

  const std::int64_t q_stride = static_cast<std::int64_t>(heads) * D;  // floats per token, q/dq/dout
  const std::int64_t kv_stride = static_cast<std::int64_t>(kv_heads) * D;  // floats per token, k/v
  const std::int64_t kv_offset = static_cast<std::int64_t>(b) * seq * kv_stride + kvh * D;
  load_rows<D, B, L::kStride, L::kThreads>(sK, k + kv_offset, kv_stride, k0, seq);
  load_rows<D, B, L::kStride, L::kThreads>(sV, v + kv_offset, kv_stride, k0, seq);

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
      load_rows<D, B, L::kStride, L::kThreads>(sQ, q + q_offset, q_stride, q0, seq);
      load_rows<D, B, L::kStride, L::kThreads>(sdO, dout + q_offset, q_stride, q0, seq);
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

  if (key < seq) {  // this block alone writes these rows of dK and dV: no atomics needed
    float* dk_row = dk + kv_offset + key * kv_stride;
    float* dv_row = dv + kv_offset + key * kv_stride;
#pragma unroll
    for (int g = 0; g < L::kGroups; ++g) {
      const int col = 4 * (sub + TPR * g);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        dk_row[col + e] += dk_acc[g][e] * scale;
        dv_row[col + e] += dv_acc[g][e];
      }
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
template <class Kernel>
void reserve_shared(Kernel kernel, std::size_t bytes, const char* name) {
  if (bytes <= kDefaultSharedBytes)
    return;
  int device = 0, limit = 0;
  check(cudaGetDevice(&device), name, "cudaGetDevice");
  check(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), name,
        "cudaDeviceGetAttribute");
  if (bytes > static_cast<std::size_t>(limit))
    throw std::runtime_error(std::string(name) + ": needs " + std::to_string(bytes) +
                             " bytes of shared memory per block, device " +
                             std::to_string(device) + " allows " + std::to_string(limit));
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes)),
        name, "cudaFuncSetAttribute");
}

// Calls f(std::integral_constant<int, D>) for a supported head dim.
template <class F>
void dispatch_head_dim(std::int64_t head_dim, F&& f) {
  switch (head_dim) {
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 80: f(std::integral_constant<int, 80>{}); break;
    case 96: f(std::integral_constant<int, 96>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    case 256: f(std::integral_constant<int, 256>{}); break;
    default: break;  // rejected by validate()
  }
}

// Rejects what the kernels cannot take, naming the value. True when there is work to queue.
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
  if (!flash_attention_supports(head_dim))
    fail("head_dim " + std::to_string(head_dim) +
         " is not supported (16, 32, 64, 80, 96, 128 or 256)");
  if (batch == 0 || seq == 0)
    return false;
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

bool flash_attention_supports(std::int64_t head_dim) {
  switch (head_dim) {
    case 16: case 32: case 64: case 80: case 96: case 128: case 256: return true;
    default: return false;
  }
}

void flash_attention_forward(cudaStream_t stream, float* out, float* lse, const float* q,
                             const float* k, const float* v, std::int64_t batch, std::int64_t seq,
                             std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim) {
  constexpr const char* name = "flash_attention_forward";
  if (!validate(name, batch, seq, heads, kv_heads, head_dim))
    return;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  dispatch_head_dim(head_dim, [&](auto tag) {
    constexpr int D = decltype(tag)::value;
    constexpr int T = kTileRows<D>;
    using L = ForwardLayout<D, T, T>;
    reserve_shared(flash_forward_kernel<D, T, T>, L::kBytes, name);
    const dim3 grid(static_cast<unsigned>(batch * heads), static_cast<unsigned>((seq + T - 1) / T));
    flash_forward_kernel<D, T, T><<<grid, L::kThreads, L::kBytes, stream>>>(
        out, lse, q, k, v, static_cast<int>(seq), static_cast<int>(heads),
        static_cast<int>(kv_heads), scale);
  });
  check(cudaGetLastError(), name, "flash_forward_kernel launch");
}

void flash_attention_backward(cudaStream_t stream, float* dq, float* dk, float* dv, float* delta,
                              const float* dout, const float* out, const float* lse,
                              const float* q, const float* k, const float* v, std::int64_t batch,
                              std::int64_t seq, std::int64_t heads, std::int64_t kv_heads,
                              std::int64_t head_dim) {
  constexpr const char* name = "flash_attention_backward";
  if (!validate(name, batch, seq, heads, kv_heads, head_dim))
    return;
  const std::int64_t rows = batch * seq * heads;
  const auto delta_blocks = static_cast<unsigned>((rows + kDeltaWarps - 1) / kDeltaWarps);
  flash_delta_kernel<<<delta_blocks, kDeltaWarps * 32, 0, stream>>>(
      delta, dout, out, rows, static_cast<int>(seq), static_cast<int>(heads),
      static_cast<int>(head_dim));
  check(cudaGetLastError(), name, "flash_delta_kernel launch");

  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  dispatch_head_dim(head_dim, [&](auto tag) {
    constexpr int D = decltype(tag)::value;
    constexpr int T = kTileRows<D>;
    constexpr int TPR = kBackwardRowThreads<D>;
    using L = BackwardLayout<D, T, TPR>;
    reserve_shared(flash_backward_kernel<D, T, TPR>, L::kBytes, name);
    const dim3 grid(static_cast<unsigned>(batch * kv_heads),
                    static_cast<unsigned>((seq + T - 1) / T));
    flash_backward_kernel<D, T, TPR><<<grid, L::kThreads, L::kBytes, stream>>>(
        dq, dk, dv, dout, lse, delta, q, k, v, static_cast<int>(seq), static_cast<int>(heads),
        static_cast<int>(kv_heads), scale);
  });
  check(cudaGetLastError(), name, "flash_backward_kernel launch");
}

}  // namespace shardplan::executor::cuda
