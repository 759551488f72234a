// The compute side of a calibration, measured on every rank at once (as a training step loads every
// device) and combined as the slowest rank's: GEMM times for the model's block shapes and for
// square shapes, the model's attention core (calibrate/attention_bench.hpp), memory copy
// bandwidth, host link bandwidth (GPU), and the host's Adam rate. Eigen fp32 on a CPU rank;
// cuBLAS bf16, fp16, tf32 and fp32 on a GPU rank (NCCL backend).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "calibrate/gemm_shapes.hpp"
#include "comm/communicator.hpp"
#include "documents/hardware.hpp"
#include "documents/workload.hpp"

namespace shardplan::calibrate {

struct ComputeSettings {
  bool gemm = true;
  bool memory = true;
  std::vector<GemmShape> model_shapes;
  // The model's layers that are not GEMMs (CPU ranks: timed with the executor's kernels).
  std::vector<documents::ElementwiseOp> elementwise_ops;
  std::int64_t tokens = 1;  // of a micro-batch, as for the GEMMs
  std::int64_t head_dim = 1;
  // The model's attention core (a micro-batch of whole sequences); none: not timed.
  std::optional<documents::AttentionShape> attention;
};

struct ComputeCalibration {
  std::string device;  // GPU name or CPU model
  bool cpu_device = true;
  std::optional<double> device_memory_bytes;              // GPU: total device memory
  std::vector<GemmMeasurement> gemm;                      // slowest rank's time per GEMM
  documents::DType model_dtype = documents::DType::fp32;  // bf16 on GPUs
  std::optional<double> memory_bandwidth_Bps;             // slowest rank's copy bandwidth
  std::optional<double> host_link_Bps;                // GPU: pinned host-to-device, slowest rank
  std::optional<double> optimizer_params_per_s;       // per rank, slowest rank
  std::optional<double> elementwise_elems_per_s;      // CPU: element passes/s, slowest rank
  std::vector<documents::AttentionSample> attention;  // slowest rank's time per core
  std::optional<documents::StragglerWait> straggler_wait;  // CPU ranks, two or more
};

// Collective over `host_world` (the MPI world). `backend_world` tells CPU from GPU ranks (an NCCL
// communicator's device and stream are used for the GPU measurements).
ComputeCalibration measure_compute(const ComputeSettings& settings, comm::Communicator& host_world,
                                   comm::Communicator& backend_world);

}  // namespace shardplan::calibrate
