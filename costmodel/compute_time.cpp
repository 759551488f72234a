#include "costmodel/compute_time.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "costmodel/block_linears.hpp"
#include "costmodel/selective_op.hpp"
#include "costmodel/traffic.hpp"
#include "documents/hardware.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/workload.hpp"

namespace shardplan::costmodel {

using documents::attention_shape;
using documents::AttentionImpl;
using documents::AttentionSample;
using documents::AttentionShape;
using documents::backward_gemms;
using documents::Calibration;
using documents::Checkpointing;
using documents::compute_dtype;
using documents::DType;
using documents::dtype_bytes;
using documents::Flavour;
using documents::flavour_name;
using documents::forward_gemms;
using documents::Gemm;
using documents::HardwareProfile;
using documents::ModelSpec;
using documents::ShardingSpec;
using documents::TrainingJob;
using documents::UnitKind;
using documents::UnitTensors;
namespace {

// cuBLAS and CUTLASS split a GEMM's output into thread-block tiles and run one tile per SM at a
// time; a partial tile costs a whole one (tile quantization) and a partial last wave of tiles
// leaves SMs idle (wave quantization). 128 × 128 is the tile of NVIDIA's "Matrix Multiplication
// Background User's Guide" (Deep Learning Performance documentation) illustrations of both;
// flash attention's query tiles are 128 rows too (Dao 2023, FlashAttention-2, §3.3).
constexpr double kTile = 128;
// Results per clock per SM of the special-function units (exp2, log2, rcp, rsqrt) on compute
// capabilities 5.x to 9.0: the CUDA C++ Programming Guide's table of arithmetic instruction
// throughput. Softmax's exp runs there, not on the tensor cores (Shah et al. 2024,
// FlashAttention-3, §3: 3.9 TFLOPS of exp against 989 TFLOPS of matmul on an H100 SXM5).
constexpr double kSpecialPerSmPerClock = 16;
// Matmul FLOPs per scored query-key pair and head dimension: forward QKᵀ and P·V (2 + 2);
// backward recomputes QKᵀ and runs dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K, dK = dSᵀ·Q (5 × 2): the
// 2.5× of the forward that FlashAttention-2's benchmarks count for the backward.
constexpr double kFlashForwardFlopsPerPairDim = 4;
constexpr double kFlashBackwardFlopsPerPairDim = 10;
// Passes over the b·a·s² scores of eager attention (HF's eager_attention_forward): forward adds the
// mask (read, write) and takes the softmax (read, write); backward's softmax gradient reads P and
// dP and writes dS.
constexpr double kEagerScoreForwardPasses = 4;
constexpr double kEagerScoreBackwardPasses = 3;
// Kernels a unit launches per attention core: flash 1 forward, 3 backward (FlashAttention-2's
// backward: the dO·O row sums, the main kernel, dQ's conversion); eager the two batched matmuls
// and the mask and softmax forward, four matmuls and the softmax gradient backward.
constexpr double kFlashKernels[2] = {1, 3};
constexpr double kEagerKernels[2] = {4, 5};

constexpr const char* kKindNames[kComputeKinds] = {"gemm",          "attention", "memory_bound",
                                                   "host_overhead", "recompute", "optimizer"};

double total_s(const ComputeTimes& t) {
  double s = 0;
  for (double x : t) s += x;
  return s;
}

double ceil_to(double x, double step) { return std::ceil(x / step) * step; }

// The calibrated GEMM that shares two of g's dimensions, scaled linearly in the third (the
// tokens of another micro-batch), or nullopt.
std::optional<double> calibrated_gemm_s(const Calibration& c, const Gemm& g, DType dtype) {
  std::optional<double> exact, scaled;
  for (const auto& s : c.gemm) {
    if (s.dtype != dtype) continue;
    if (s.m == g.m && s.n == g.n && s.k == g.k)
      exact = s.time_s;
    else if (s.n == g.n && s.k == g.k)
      scaled = s.time_s * static_cast<double>(g.m) / static_cast<double>(s.m);
    else if (s.m == g.m && s.n == g.n)
      scaled = s.time_s * static_cast<double>(g.k) / static_cast<double>(s.k);
    else if (s.m == g.m && s.k == g.k)
      scaled = s.time_s * static_cast<double>(g.n) / static_cast<double>(s.n);
  }
  if (exact) return *exact * g.count;
  if (scaled) return *scaled * g.count;
  return std::nullopt;
}

}  // namespace

const char* compute_kind_name(ComputeKind k) { return kKindNames[static_cast<int>(k)]; }

double UnitWork::forward_s() const { return total_s(forward); }
double UnitWork::backward_s() const { return total_s(backward); }

ComputeModel::ComputeModel(const HardwareProfile& hw, const TrainingJob& job)
    : hw_(&hw), job_(&job), dtype_(compute_dtype(job.precision)),
      // A CPU has no TF32: an fp32 job (tf32 on a GPU) runs the fp32 kernels calibrate timed.
      measured_dtype_(hw.is_cpu && dtype_ == DType::tf32 ? DType::fp32 : dtype_) {
  const double eff = hw.calibration && hw.calibration->compute_efficiency
                         ? *hw.calibration->compute_efficiency
                         : hw.compute_efficiency;
  gemm_rate_ = hw.peak(dtype_) * eff * hw.clock_ratio();
  fp8_gemm_rate_ = hw.fp8_peak_flops * eff * hw.clock_ratio();
  memory_rate_ = hw.calibration && hw.calibration->memory_bandwidth_Bps
                     ? *hw.calibration->memory_bandwidth_Bps
                     : hw.hbm_bandwidth_Bps * hw.memory_bandwidth_efficiency;
  const double clock = hw.boost_clock_hz > 0 ? hw.sustained_clock_hz : 0;
  special_rate_ = hw.sm_count * kSpecialPerSmPerClock * clock;
}

double ComputeModel::wave_factor(double tiles) const {
  if (hw_->sm_count <= 0 || tiles <= 0) return 1;
  const double sms = hw_->sm_count;
  return tiles / (std::ceil(tiles / sms) * sms);
}

double ComputeModel::gemm_s(const Gemm& g) const {
  if (hw_->calibration)
    if (auto t = calibrated_gemm_s(*hw_->calibration, g, measured_dtype_)) return *t;
  return roofline_s(g, gemm_rate_, dtype_bytes(dtype_), dtype_bytes(dtype_));
}

double ComputeModel::fp8_gemm_s(const Gemm& g) const {
  return roofline_s(g, fp8_gemm_rate_, 1, dtype_bytes(dtype_));
}

double ComputeModel::roofline_s(const Gemm& g, double rate, double operand_bytes,
                                double output_bytes) const {
  const auto m = static_cast<double>(g.m), n = static_cast<double>(g.n),
             k = static_cast<double>(g.k);
  const double tile = hw_->sm_count > 0 ? kTile : 1;
  const double flops = 2 * ceil_to(m, tile) * ceil_to(n, tile) * k /
                       wave_factor(std::ceil(m / kTile) * std::ceil(n / kTile));
  const double bytes = (m * k + k * n) * operand_bytes + m * n * output_bytes;
  return std::max(flops / rate, bytes / memory_rate_) * g.count;
}

const AttentionSample* ComputeModel::attention_sample(const AttentionShape& a) const {
  if (!hw_->calibration) return nullptr;
  const char* impl = job_->attention == AttentionImpl::flash ? "flash" : "eager";
  const AttentionSample* best = nullptr;
  double best_distance = 0;
  for (const auto& s : hw_->calibration->attention) {
    if (s.impl != impl || s.dtype != measured_dtype_) continue;
    // The nearest in sequence length and head width (log ratios), then in the GQA group.
    const double distance =
        std::abs(std::log(static_cast<double>(s.seq) / static_cast<double>(a.seq))) +
        std::abs(std::log(static_cast<double>(s.head_dim) / static_cast<double>(a.head_dim))) +
        (s.heads / s.kv_heads == a.heads / a.kv_heads ? 0.0 : 1e-3);
    if (best == nullptr || distance < best_distance) {
      best = &s;
      best_distance = distance;
    }
  }
  return best;
}

// A measured core scaled to another shape by its scored pairs times the head width (both the
// matmuls and the softmax grow with the pairs; the matmuls with the width).
double ComputeModel::attention_scale(const AttentionShape& a, const AttentionSample& s) const {
  const AttentionShape measured{s.batch, s.seq, s.heads, s.kv_heads, s.head_dim};
  return a.scored_pairs() * static_cast<double>(a.head_dim) /
         (measured.scored_pairs() * static_cast<double>(s.head_dim));
}

double ComputeModel::attention_forward_s(const AttentionShape& a) const {
  return attention_s(a, false);
}
double ComputeModel::attention_backward_s(const AttentionShape& a) const {
  return attention_s(a, true);
}

double ComputeModel::attention_s(const AttentionShape& a, bool backward) const {
  if (const auto* s = attention_sample(a))
    return (backward ? s->backward_s : s->forward_s) * attention_scale(a, *s);
  const auto d = static_cast<double>(a.head_dim), sq = static_cast<double>(a.seq);
  const double heads = static_cast<double>(a.batch) * static_cast<double>(a.heads);
  if (job_->attention == AttentionImpl::flash) {
    // Per scored pair: the matmul FLOPs and one exp, one after the other (FlashAttention-2 does
    // not overlap them), over tiles of 128 query rows per (sequence, head).
    const double exp_s = special_rate_ > 0 ? 1 / special_rate_ : passes_s(1, 4);
    const double flops = backward ? kFlashBackwardFlopsPerPairDim : kFlashForwardFlopsPerPairDim;
    return a.scored_pairs() * (flops * d / gemm_rate_ + exp_s) /
           wave_factor(heads * std::ceil(sq / kTile));
  }
  // Eager: the full s × s scores as batched GEMMs, and passes over the scores. Forward: QKᵀ
  // (s × s × d) and P·V (s × d × s); backward: dP = dO·Vᵀ (s × s × d) and dV = Pᵀ·dO, dQ = dS·K,
  // dK = dSᵀ·Q (s × d × s).
  const double scores = gemm_s({a.seq, a.seq, a.head_dim, heads});
  const double values = gemm_s({a.seq, a.head_dim, a.seq, heads});
  return scores + (backward ? 3 : 1) * values +
         passes_s((backward ? kEagerScoreBackwardPasses : kEagerScoreForwardPasses) * heads * sq *
                      sq,
                  dtype_bytes(dtype_));
}

double ComputeModel::memory_s(double bytes) const { return bytes / memory_rate_; }

double ComputeModel::passes_s(double elements, double bytes_per_element) const {
  if (hw_->calibration && hw_->calibration->elementwise_elems_per_s)
    return elements / *hw_->calibration->elementwise_elems_per_s;
  return memory_s(elements * bytes_per_element);
}

double ComputeModel::traffic_s(double bytes) const {
  const double e = dtype_bytes(dtype_);
  return passes_s(bytes / e, e);
}

namespace {

std::int64_t split_up(std::int64_t n, int t) { return (n + t - 1) / t; }

// A linear's forward GEMM over `tokens` on one of t ranks (TensorSplit): a row-parallel linear
// splits its input width, the others their output width.
Gemm split_gemm(const Matmul& mm, std::int64_t tokens, int t) {
  if (mm.row_parallel) return {tokens, mm.out, split_up(mm.in, t), 1};
  return {tokens, split_up(mm.out, t), mm.in, 1};
}

// One linear's forward GEMM on one rank and whether the job's Float8 converts it.
struct LinearGemm {
  Gemm forward;
  bool fp8 = false;
};

// The unit's linears on one rank: the block's (block_linears.hpp); the head's projection,
// column-parallel over the vocabulary.
std::vector<LinearGemm> unit_gemms(const ModelSpec& m, const TrainingJob& j, UnitKind unit,
                                   std::int64_t tokens, int t) {
  std::vector<LinearGemm> gemms;
  if (unit == UnitKind::block) {
    for (const auto& mm : block_matmuls(m, j)) gemms.push_back({split_gemm(mm, tokens, t), mm.fp8});
    return gemms;
  }
  for (auto g : forward_gemms(m, unit, tokens)) {
    g.n = split_up(g.n, t);
    gemms.push_back({g, unit == UnitKind::head && head_float8(m, j)});
  }
  return gemms;
}

// Bytes a Float8 cast moves per element of its 16-bit input (torchao 0.18,
// float8_scaling_utils.py hp_tensor_to_float8_dynamic: tensor_to_amax, then
// hp_tensor_and_scale_to_float8). Eager, op by op: abs (read 2, write 2) and amax (read 2), then
// to(float32) (2, 4), the multiply by the scale (4, 4), the saturating clamp (4, 4) and to(fp8)
// (4, 1): 33. Compiled, Inductor fuses each side of the reduction: the amax pass reads the
// tensor (2) and the scaled cast reads it again and writes fp8 (2 + 1): 5. Derived, not fitted:
// the compiled block's generated kernels in tests/costmodel/data/oracle_float8_units.json
// (rowwise against bf16, two shapes of one config) move 3 bytes per weight element and 4 per row
// scale in the forward, where the input casts also fuse into the kernels that make the inputs
// (1.4 bytes per input element), and about 9 per weight and 3.7 per activation element in the
// backward: over a block at T = 64 the derivation is within 3% of the measured total, at large T
// it counts the activations' casts up to about 1.6 times what they move.
constexpr double kFloat8CastBytesEager = 33;
constexpr double kFloat8CastBytesCompiled = 5;
// Kernels per cast: eager the six tensor-sized ops above and the scale's own (amax_to_scale's
// float64 division and round_scales_to_power_of_2) counted as one; compiled the two passes.
constexpr double kFloat8CastKernelsEager = 7;
constexpr double kFloat8CastKernelsCompiled = 2;

// A converted linear's GEMMs and casts, added to w (torchao 0.18, float8_linear.py,
// matmul_with_hp_or_float8_args). Forward: the input [T, in] and the weight [out, in] cast, the
// output GEMM in fp8. Backward: the output gradient [T, out] cast and the weight cast again for
// the input gradient's GEMM; under rowwise the output gradient and the input cast once more along
// the other axis for the weight gradient's GEMM, in fp8; under rowwise_with_gw_hp that GEMM runs
// on the 16-bit tensors (its casts DISABLED).
void add_float8_linear(const ComputeModel& cm, const TrainingJob& j, const Gemm& g, UnitWork& w) {
  const auto gemm = static_cast<int>(ComputeKind::gemm);
  const auto memory = static_cast<int>(ComputeKind::memory_bound);
  const auto grads = backward_gemms(g);
  const bool gw_fp8 = j.float8 == documents::Float8Recipe::rowwise;
  w.forward[gemm] += cm.fp8_gemm_s(g);
  w.backward[gemm] +=
      cm.fp8_gemm_s(grads[0]) + (gw_fp8 ? cm.fp8_gemm_s(grads[1]) : cm.gemm_s(grads[1]));
  const double T = static_cast<double>(g.m), out = static_cast<double>(g.n),
               in = static_cast<double>(g.k), weight = out * in;
  const double forward_casts = T * in + weight;
  const double backward_casts = T * out + weight + (gw_fp8 ? T * out + T * in : 0);
  const double bytes = j.compile ? kFloat8CastBytesCompiled : kFloat8CastBytesEager;
  const double kernels = j.compile ? kFloat8CastKernelsCompiled : kFloat8CastKernelsEager;
  w.forward[memory] += cm.traffic_s(forward_casts * bytes);
  w.backward[memory] += cm.traffic_s(backward_casts * bytes);
  w.forward_kernels += 1 + 2 * kernels;
  w.backward_kernels += 2 + (gw_fp8 ? 4 : 2) * kernels;
}

// A unit's memory-bound bytes and kernels on one rank (traffic.hpp, OpSpread): the residual
// stream's ops split along the sequence under sequence parallelism, the loss's over the vocabulary
// where it runs on the rank's columns, the rest by t; every rank launches every kernel. (A
// compiled block, whose forward is its kernels' and not its rows' sum, runs at t = 1 only:
// documents::layout_problems.)
Traffic split_traffic(const ModelSpec& m, const TrainingJob& j, const Forward& f, UnitKind unit,
                      const TensorSplit& s) {
  if (s.t == 1) return unit_traffic(m, j, f, unit);
  const double t = s.t, r = s.sequence_parallel ? t : 1, v = s.vocabulary_parallel_loss ? t : 1;
  Traffic out;
  for (const auto& op : unit_ops(m, j, f, unit)) {
    const double by = op.spread == OpSpread::residual     ? r
                      : op.spread == OpSpread::vocabulary ? v
                                                          : t;
    out.forward += op.moved.forward / by;
    out.backward += op.moved.backward / by;
    out.forward_ops += op.moved.forward_ops;
    out.backward_ops += op.moved.backward_ops;
  }
  return out;
}

}  // namespace

UnitWork unit_work(const ComputeModel& cm, const ModelSpec& m, const TrainingJob& j, UnitKind unit,
                   const Forward& f, int context, const TensorSplit& split) {
  const auto tokens = j.seq_len * j.micro_batch;
  UnitWork w;
  const auto gemm = static_cast<int>(ComputeKind::gemm);
  const auto attention = static_cast<int>(ComputeKind::attention);
  const auto memory = static_cast<int>(ComputeKind::memory_bound);
  for (const auto& [g, fp8] : unit_gemms(m, j, unit, tokens, split.t)) {
    if (fp8) {
      add_float8_linear(cm, j, g, w);
      continue;
    }
    w.forward[gemm] += cm.gemm_s(g);
    for (const auto& b : backward_gemms(g)) w.backward[gemm] += cm.gemm_s(b);
    w.forward_kernels += 1;
    w.backward_kernels += 2;
  }
  if (unit == UnitKind::block && m.heads > 0) {
    auto a = attention_shape(m, j, context);
    a.heads = split_up(a.heads, split.t);
    a.kv_heads = split_up(a.kv_heads, split.t);
    w.forward[attention] = cm.attention_forward_s(a);
    w.backward[attention] = cm.attention_backward_s(a);
    const bool flash = j.attention == AttentionImpl::flash;
    w.forward_kernels += flash ? kFlashKernels[0] : kEagerKernels[0];
    w.backward_kernels += flash ? kFlashKernels[1] : kEagerKernels[1];
  }
  const Traffic moved = split_traffic(m, j, f, unit, split);
  w.forward[memory] += cm.traffic_s(moved.forward);
  w.backward[memory] += cm.traffic_s(moved.backward);
  w.forward_kernels += moved.forward_ops;
  w.backward_kernels += moved.backward_ops;
  return w;
}

ComputeTimes block_recompute(const ComputeModel& cm, const ModelSpec& m, const TrainingJob& j,
                             const Forward& f, const TensorSplit& split) {
  ComputeTimes r{};
  const auto tokens = j.seq_len * j.micro_batch;
  if (j.checkpointing == Checkpointing::selective_attention &&
      j.attention == AttentionImpl::eager) {
    // Megatron's selective recompute reruns the eager attention core.
    auto a = attention_shape(m, j);
    a.heads = split_up(a.heads, split.t);
    a.kv_heads = split_up(a.kv_heads, split.t);
    r[static_cast<int>(ComputeKind::attention)] = cm.attention_forward_s(a);
  } else if (j.checkpointing == Checkpointing::selective_op) {
    // torchtitan's op-level policy reruns the linears its save list does not keep (every second
    // aten::mm it counts: of wqkv, wo, w1, w3, w2, wo and w3) and the element-wise ops it omits.
    const auto mms = block_matmuls(m, j);
    const auto rerun = selective_op_reruns(mms);
    for (std::size_t i = 0; i < mms.size(); ++i) {
      if (!rerun[i]) continue;
      const Gemm g = split_gemm(mms[i], tokens, split.t);
      if (!mms[i].fp8) {
        r[static_cast<int>(ComputeKind::gemm)] += cm.gemm_s(g);
        continue;
      }
      UnitWork w;  // a Float8 linear's forward again: its casts and its fp8 GEMM
      add_float8_linear(cm, j, g, w);
      r[static_cast<int>(ComputeKind::gemm)] += w.forward[static_cast<int>(ComputeKind::gemm)];
      r[static_cast<int>(ComputeKind::memory_bound)] +=
          w.forward[static_cast<int>(ComputeKind::memory_bound)];
    }
    // The rerun's element-wise ops: the block's forward less what the early stop skips, the
    // residual stream's share split as the block's.
    const Traffic again = recompute_traffic(m, j, f);
    const Traffic residual = unit_traffic(m, j, f, UnitKind::block, OpSpread::residual);
    const double sp = split.sequence_parallel ? split.t : 1;
    r[static_cast<int>(ComputeKind::memory_bound)] += cm.traffic_s(
        split.t == 1 ? again.forward
                     : residual.forward / sp + (again.forward - residual.forward) / split.t);
  }
  return r;
}

std::string framework_key(const ShardingSpec& s) {
  if (s.flavour != Flavour::deepspeed) return flavour_name(s.flavour);
  return s.shard_parameters ? "deepspeed_zero3" : "deepspeed_zero12";
}

double unit_seconds(const HardwareProfile& hw, const ComputeTimes& device, double host,
                    ComputeTimes& kinds) {
  const double dev = std::accumulate(device.begin(), device.end(), 0.0);
  const double t = hw.is_cpu ? dev + host : std::max(dev, host);
  for (int c = 0; c < kComputeKinds; ++c) kinds[c] += device[c];
  kinds[static_cast<int>(ComputeKind::host_overhead)] += t - dev;
  return t;
}

HostWork unit_host_work(const HardwareProfile& hw, const std::string& flavour, const UnitWork& work,
                        const UnitTensors& unit) {
  const auto tensors = static_cast<double>(unit.tensors.size());
  const auto submodules = static_cast<double>(unit.matrices());
  HostWork h{work.forward_kernels * hw.op_dispatch_s, work.backward_kernels * hw.op_dispatch_s};
  const auto it = hw.framework.find(flavour);
  if (it != hw.framework.end()) {
    const auto& f = it->second;
    h.forward_s +=
        f.forward_unit_s + submodules * f.forward_submodule_s + tensors * f.forward_tensor_s;
    h.backward_s +=
        f.backward_unit_s + submodules * f.backward_submodule_s + tensors * f.backward_tensor_s;
  }
  return h;
}

}  // namespace shardplan::costmodel
