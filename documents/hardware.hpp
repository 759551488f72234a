// The hardware profile document (hardware_profiles/<name>.json): one system's GPU, node, links and
// overheads from its datasheet, and optionally what `calibrate` measured on it, which then takes
// precedence. Units are fixed here: the document's keys carry them (memory_GiB, bandwidth_GBps,
// latency_us, peak_TFLOPs); the struct holds SI (bytes, bytes/s, seconds, FLOP/s).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "documents/collectives.hpp"

namespace shardplan::documents {

enum class DType { fp32, tf32, bf16, fp16 };
const char* dtype_name(DType d);
inline double dtype_bytes(DType d) { return d == DType::bf16 || d == DType::fp16 ? 2.0 : 4.0; }

// Which links a communication group crosses.
enum class Tier { intra_node, inter_node };
const char* tier_name(Tier t);

// A fitted piece of a collective's time curve: time = latency + size / bandwidth for sizes in
// [min_bytes, max_bytes] (size in nccl-tests' sense, see collectives.hpp).
struct CurveSegment {
  double min_bytes = 0;
  double max_bytes = 0;
  double latency_s = 0;
  double bandwidth_Bps = 0;  // size bytes per second of the fit (algorithm bandwidth)
};

struct MeasuredSample {
  double size_bytes = 0;
  double time_s = 0;
};

// One calibrated collective: an operation on a group of `ranks`, over one tier.
struct CollectiveCurve {
  Collective op = Collective::all_reduce;
  int ranks = 0;
  Tier tier = Tier::intra_node;
  std::vector<CurveSegment> segments;  // ordered by size, covering the measured range
  std::vector<MeasuredSample> samples;
  double median_rel_error = 0;  // of the fit at the measured points
  double max_rel_error = 0;
  // The errors calibrate asked the fit to reach (absent in older profiles: none known).
  std::optional<double> goal_median_rel_error, goal_max_rel_error;
  // Whether the fit's errors exceed the goal it was made for (false where none is known).
  bool misses_goal() const {
    return (goal_median_rel_error && median_rel_error > *goal_median_rel_error) ||
           (goal_max_rel_error && max_rel_error > *goal_max_rel_error);
  }
  // Time of a collective of nccl-tests size `size_bytes` from the fit; beyond the measured
  // range the nearest segment's line is extended.
  double time_s(double size_bytes) const;
};

struct GemmSample {
  std::int64_t m = 0, n = 0, k = 0;
  DType dtype = DType::bf16;
  double time_s = 0;
  double flops_per_s() const { return 2.0 * static_cast<double>(m) * n * k / time_s; }
};

// One attention core timed by calibrate with the executor's kernels (CPU) or the CUDA kernels
// (GPU): the causal attention of `batch` sequences of `seq` tokens, `heads` query heads sharing
// `kv_heads` key/value heads of `head_dim` each, forward and backward.
struct AttentionSample {
  std::string impl;  // "eager" or "flash"
  DType dtype = DType::fp32;
  std::int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  double forward_s = 0;
  double backward_s = 0;
};

// A framework's host work per micro-batch beside its kernels: hooks, bookkeeping and the copies
// into and out of its flat buffers, per sharding unit, per linear submodule (DeepSpeed ZeRO-3
// hooks every submodule) and per parameter tensor, forward and backward. Measured with the
// frameworks' own code (validation/measure_overheads.py,
// tests/costmodel/data/oracle_overheads.json).
struct FrameworkOverheads {
  double forward_unit_s = 0, backward_unit_s = 0;
  double forward_tensor_s = 0, backward_tensor_s = 0;
  double forward_submodule_s = 0, backward_submodule_s = 0;
};

// What a collective that blocks the computing thread waits for the slowest rank: the ranks run the
// same work between two collectives, but each run's time varies (other processes, the OS, caches),
// so each collective ends at the slowest rank's arrival. calibrate starts one transformer block's
// GEMMs together on every rank, `repetitions` times, and keeps
// fraction = Σ(slowest − mean) / Σ mean over the repetitions, at `ranks` ranks.
struct StragglerWait {
  double fraction = 0;   // of the compute time between two collectives
  int ranks = 0;         // ranks it was measured with
  double segment_s = 0;  // the median mean time of the measured segment
  int repetitions = 0;
};

// clang-tidy 14 says its (noexcept) default constructor may throw: it follows nlohmann::json's
// noexcept default constructor into json_value(value_t), to a throw that null never reaches
// (llvm/llvm-project#54956: the analysis does not stop at noexcept).
struct Calibration {    // NOLINT(bugprone-exception-escape)
  std::string date;     // ISO 8601
  std::string backend;  // "nccl" or "mpi"
  std::string host;
  std::string library;  // e.g. "NCCL 2.21.5", "Open MPI 4.1.4"
  int ranks = 0;
  std::vector<CollectiveCurve> collectives;
  std::vector<GemmSample> gemm;
  std::optional<double> compute_efficiency;    // achieved / peak for the model's GEMM shapes
  std::optional<double> memory_bandwidth_Bps;  // measured device copy bandwidth
  // Element passes per second of the layers that are not GEMMs (documents/workload.hpp). With
  // it, the GEMM rate above is the GEMMs' alone and the cost model adds these layers' time;
  // without it (a datasheet profile) compute_efficiency stands for the whole step.
  std::optional<double> elementwise_elems_per_s;
  std::vector<AttentionSample> attention;       // the model's attention cores, as run
  std::optional<StragglerWait> straggler_wait;  // measured on two or more ranks
  nlohmann::json extra;                         // anything calibrate keeps for the record
};

struct HardwareProfile {
  std::string name;  // file stem
  std::string description;
  // GPU (or, for a CPU profile, the host as the device)
  std::string device;                  // "NVIDIA H100 80GB HBM3"
  double memory_bytes = 0;             // per device
  std::map<DType, double> peak_flops;  // dense FLOP/s per dtype
  // Dense FLOP/s of its FP8 tensor cores (e4m3 and e5m2 operands, 16- or 32-bit output); 0 where
  // the GPU has none (A100) or the profile does not say.
  double fp8_peak_flops = 0;
  double hbm_bandwidth_Bps = 0;
  double compute_efficiency = 0;  // fraction of peak a large transformer GEMM reaches
  // Streaming multiprocessors: the GEMM and attention kernels' tiles run in waves of one tile per
  // SM (0 on a CPU profile: no tile or wave quantization).
  int sm_count = 0;
  // peak_flops are at the boost clock; a part held at a lower clock (its power limit) runs every
  // compute rate at sustained / boost of it. Both 0 when the profile gives no clocks (ratio 1).
  double boost_clock_hz = 0;
  double sustained_clock_hz = 0;
  double power_limit_w = 0;  // the board power the clocks are for (0: not given)
  // Fraction of hbm_bandwidth_Bps a streaming kernel reaches (a copy or triad benchmark).
  double memory_bandwidth_efficiency = 1;
  // A CPU "device" (a calibrated MPI host): no CUDA context, NCCL workspace or caching allocator.
  bool is_cpu = false;
  // Its collectives block the thread that computes, so nothing overlaps (MPI called on that
  // thread): a CPU profile's default. False for GPUs, and for a CPU profile whose /gpu/collectives
  // is "overlapped" (each group's collectives on a thread of its own: executor
  // --collective-streams), which the simulator then runs on their own streams as a GPU's.
  bool collectives_block = false;
  // node and links
  int gpus_per_node = 0;
  double intra_bandwidth_Bps = 0;  // per GPU, one direction (NVLink, or PCIe without it)
  double intra_latency_s = 0;      // per ring step inside a node
  double inter_bandwidth_Bps = 0;  // per GPU, one direction (its share of the node's NICs)
  // The document gave /inter_node/bandwidth_GBps_per_node (divided by gpus_per_node above), not
  // bandwidth_GBps_per_gpu.
  bool inter_bandwidth_per_node_key = false;
  double inter_latency_s = 0;  // per ring step across nodes
  // host (for offload)
  double host_memory_bytes = 0;  // per node
  double host_link_Bps = 0;      // per GPU, host <-> device (PCIe)
  // Parameters one node's CPUs update per second (offload), for every framework; or (then 0) per
  // framework family where the profile tells them apart: "deepspeed" (DeepSpeedCPUAdam) and
  // "torch" (torch.optim.AdamW on CPU tensors, FSDP's CPUOffload). Read through
  // host_optimizer_rate.
  double host_optimizer_params_per_s = 0;
  std::map<std::string, double> host_optimizer_by_framework;
  // framework (host) side
  double op_dispatch_s = 0;  // host time to issue one kernel from eager PyTorch
  // By framework: ddp, fsdp1, fsdp2, deepspeed_zero12 (stages 1 and 2), deepspeed_zero3.
  std::map<std::string, FrameworkOverheads> framework;
  // overheads
  double cuda_context_bytes = 0;
  double nccl_workspace_bytes = 0;
  double fragmentation = 0;  // reserve as a fraction of the allocated peak
  std::optional<Calibration> calibration;

  double peak(DType d) const;  // FLOP/s; falls back bf16 -> fp16 -> fp32
  // sustained / boost clock (1 when the profile gives no clocks).
  double clock_ratio() const {
    return boost_clock_hz > 0 ? sustained_clock_hz / boost_clock_hz : 1.0;
  }
  // The host optimizer rate of a framework family ("deepspeed" or "torch").
  double host_optimizer_rate(const std::string& family) const;
  // The calibrated straggler wait of a blocking collective over `ranks` ranks, as a fraction of
  // the compute time since the previous collective; 0 without a measurement or for one rank.
  double straggler_wait_fraction(int ranks) const;
};

// A profile name (stem under hardware_profiles/) or a path. Throws InputError.
HardwareProfile load_hardware(const std::string& name_or_path);
HardwareProfile hardware_from_json(const nlohmann::json& doc, const std::string& name);
nlohmann::json hardware_to_json(const HardwareProfile& p);
std::vector<std::string> preset_hardware_names();  // the stems in hardware_profiles/

}  // namespace shardplan::documents
