// The compute stream's time per op kind: GEMMs at a rate that depends on their shape, the
// attention core at its own rate, the layers that are not GEMMs as bytes over memory bandwidth,
// and the host's work (kernel launches, the framework's hooks) where it outlasts the device's.
//
// A unit's work (its GEMMs, attention core and element-wise layers) is the model's workload
// (documents/workload.hpp); its element-wise layers move the bytes of the recipe's ops
// (costmodel/traffic.hpp) or the executor's kernels' passes (documents/workload.hpp).
// Recompute reruns what the checkpointing mode drops (block_recompute). The optimizer step is
// the simulator's (bytes over memory bandwidth, or the host's rate when offloaded).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "costmodel/accounting.hpp"
#include "documents/hardware.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/sharding.hpp"
#include "documents/workload.hpp"

namespace shardplan::costmodel {

// What the compute stream's time is spent on, in the order reports list them.
enum class ComputeKind { gemm, attention, memory_bound, host_overhead, recompute, optimizer };
constexpr int kComputeKinds = 6;
const char* compute_kind_name(ComputeKind k);
using ComputeTimes = std::array<double, kComputeKinds>;  // seconds per ComputeKind

// One unit's work on the device, per micro-batch, by kind (gemm, attention, memory_bound), and the
// kernels it launches.
struct UnitWork {
  ComputeTimes forward{}, backward{};
  double forward_kernels = 0, backward_kernels = 0;
  double forward_s() const;
  double backward_s() const;
};

// The rates of one device for one job's compute dtype.
class ComputeModel {
public:
  ComputeModel(const documents::HardwareProfile& hw, const documents::TrainingJob& job);

  // A GEMM's time: the calibrated time of the same shape where calibrate measured it; otherwise
  // the larger of its FLOPs (its tiles rounded up to whole tiles and waves) at the GEMM rate and
  // its operands' bytes at the memory rate (a roofline).
  double gemm_s(const documents::Gemm& g) const;
  // The same GEMM on fp8 operands (1 byte each, a 16-bit output) at the profile's fp8 peak and
  // the same efficiency; calibrate measures no fp8 GEMMs yet, so there is no calibrated sample.
  double fp8_gemm_s(const documents::Gemm& g) const;
  // The attention core's forward and backward (flash or eager, by the job).
  double attention_forward_s(const documents::AttentionShape& a) const;
  double attention_backward_s(const documents::AttentionShape& a) const;
  // Bytes read and written by a memory-bound kernel.
  double memory_s(double bytes) const;
  // `elements` element passes (elementwise.hpp) of `bytes_per_element` each: the calibrated
  // element-wise rate where there is one, else their bytes over the memory rate.
  double passes_s(double elements, double bytes_per_element) const;
  // The bytes a recipe's memory-bound ops move (traffic.hpp), at the same rate: over memory
  // bandwidth, or as element passes of the compute dtype at the calibrated element-wise rate.
  double traffic_s(double bytes) const;

  double gemm_rate() const { return gemm_rate_; }        // FLOP/s of a large GEMM
  double memory_rate() const { return memory_rate_; }    // bytes/s of a streaming kernel
  double special_rate() const { return special_rate_; }  // exp/s of the SFUs (0: not a GPU's)

private:
  const documents::HardwareProfile* hw_;
  const documents::TrainingJob* job_;
  documents::DType dtype_;
  documents::DType measured_dtype_;  // the dtype of the calibrated samples that stand for dtype_
  double gemm_rate_ = 0, memory_rate_ = 0, special_rate_ = 0;
  double fp8_gemm_rate_ = 0;  // 0: the GPU has no fp8 tensor cores
  double roofline_s(const documents::Gemm& g, double rate, double operand_bytes,
                    double output_bytes) const;
  double wave_factor(double tiles) const;
  const documents::AttentionSample* attention_sample(const documents::AttentionShape& a) const;
  double attention_scale(const documents::AttentionShape& a,
                         const documents::AttentionSample& s) const;
  double attention_s(const documents::AttentionShape& a, bool backward) const;
};

// How tensor parallelism splits a unit's work over its t ranks (Megatron-LM's and PyTorch's
// column- and row-parallel linears, Shoeybi et al. 2019, §3): a linear writing the residual width
// (the attention's output and the MLP's down projection) splits its input features, every other
// linear its output features, the head's projection the vocabulary; the attention splits its
// heads; the element-wise ops of the heads' and the MLP's width split by t, those of the residual
// width (norms, residual adds) only under sequence parallelism, which splits them along the
// sequence; the head's loss where it runs on the rank's vocabulary. Each rank still launches every
// kernel. t = 1: the whole unit.
struct TensorSplit {
  int t = 1;
  bool sequence_parallel = false;
  bool vocabulary_parallel_loss = true;
};

// Per micro-batch work of each unit kind on one rank; the block's is one block's. `f`: the dtypes
// the forward reads (accounting.hpp); its memory-bound ops move the bytes of its recipe's rows
// (costmodel/traffic.hpp, unit_ops).
// `context`: the ranks sharing each sequence (j holds this rank's share of it).
UnitWork unit_work(const ComputeModel& cm, const documents::ModelSpec& m,
                   const documents::TrainingJob& j, documents::UnitKind unit, const Forward& f,
                   int context = 1, const TensorSplit& split = {});
// One block's rerun in backward under the job's checkpointing mode, by kind (0 for none).
ComputeTimes block_recompute(const ComputeModel& cm, const documents::ModelSpec& m,
                             const documents::TrainingJob& j, const Forward& f,
                             const TensorSplit& split = {});

// The host's time to issue a unit's forward or backward: its kernel launches and the framework's
// hooks per unit, linear submodule and parameter tensor (hardware.hpp's FrameworkOverheads, by
// flavour name).
struct HostWork {
  double forward_s = 0, backward_s = 0;
};
// `unit`: its parameter tensors, hooked each, and its linear layers (matrices), each a submodule.
HostWork unit_host_work(const documents::HardwareProfile& hw, const std::string& flavour,
                        const UnitWork& work, const documents::UnitTensors& unit);
// The framework key of a data-parallel engine's hooks (HardwareProfile::framework): the flavour's
// name, DeepSpeed's by stage (it hooks every submodule only at stage 3, where it gathers).
std::string framework_key(const documents::ShardingSpec& s);
// A unit's forward or backward on the compute stream: a GPU runs it at the slower of its kernels
// and the host's issuing of them (the kernels queue behind the host), a CPU rank does both in
// turn. Adds the device's seconds by kind, and the host's excess, to `kinds`; returns the total.
double unit_seconds(const documents::HardwareProfile& hw, const ComputeTimes& device, double host,
                    ComputeTimes& kinds);

}  // namespace shardplan::costmodel
