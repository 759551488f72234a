#include "calibrate/compute_calibration.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "calibrate/attention_bench.hpp"
#include "calibrate/cpu_bench.hpp"
#include "calibrate/elementwise_bench.hpp"
#include "calibrate/host_info.hpp"

#if defined(SHARDPLAN_HAVE_NCCL)
#include "calibrate/cuda_bench.hpp"
#include "comm/nccl_communicator.hpp"
#endif

namespace shardplan::calibrate {
namespace {

constexpr std::size_t kCpuCopyBytes = 64u << 20;  // well beyond the caches
constexpr std::size_t kAdamParams = 4u << 20;     // 64 MiB of fp32 state
constexpr double kAttentionSeconds = 0.02;        // timed runs of a core fill at least this
#if defined(SHARDPLAN_HAVE_NCCL)
constexpr std::size_t kGpuCopyBytes = 1u << 30;     // device-to-device copy
constexpr std::size_t kHostLinkBytes = 256u << 20;  // host-to-device copy
#endif

// Every rank's times become the slowest rank's.
void keep_slowest(comm::Communicator& world, std::vector<GemmMeasurement>& gemms) {
  std::vector<double> times;
  times.reserve(gemms.size());
  for (const auto& g : gemms) times.push_back(g.time_s);
  world.all_reduce(times.data(), times.data(), times.size(), comm::DataType::f64,
                   comm::ReduceOp::max);
  for (std::size_t i = 0; i < gemms.size(); ++i) gemms[i].time_s = times[i];
}

void keep_slowest(comm::Communicator& world, std::vector<documents::AttentionSample>& cores) {
  std::vector<double> times;
  for (const auto& a : cores) {
    times.push_back(a.forward_s);
    times.push_back(a.backward_s);
  }
  world.all_reduce(times.data(), times.data(), times.size(), comm::DataType::f64,
                   comm::ReduceOp::max);
  for (std::size_t i = 0; i < cores.size(); ++i) {
    cores[i].forward_s = times[2 * i];
    cores[i].backward_s = times[2 * i + 1];
  }
}

double slowest_rate(comm::Communicator& world, double rate) {
  double lowest = 0;
  world.all_reduce(&rate, &lowest, 1, comm::DataType::f64, comm::ReduceOp::min);
  return lowest;
}

std::vector<GemmMeasurement> cpu_gemms(const std::vector<GemmShape>& shapes, bool model_shapes,
                                       comm::Communicator& world) {
  std::vector<GemmMeasurement> out;
  for (const auto& s : shapes) {
    world.barrier();  // every rank computes at once
    out.push_back({s, documents::DType::fp32, time_cpu_gemm(s), model_shapes});
  }
  return out;
}

// The straggler wait of a blocking collective (documents::StragglerWait): one transformer block's
// GEMMs, forward and backward (the compute between two of FSDP's collectives is a block's forward
// or backward), run back to back, started together on every rank, as many times as fill
// kStragglerSeconds (8 to 40); per repetition the slowest rank's time less the ranks' mean is what
// the ranks wait, on average, at the collective that follows.
constexpr double kStragglerSeconds = 2.0;

std::optional<documents::StragglerWait> measure_straggler_wait(const std::vector<GemmShape>& shapes,
                                                               comm::Communicator& world) {
  const int ranks = world.size();
  std::vector<GemmShape> block;
  std::copy_if(shapes.begin(), shapes.end(), std::back_inserter(block),
               [](const GemmShape& s) { return !s.head; });
  if (ranks < 2 || block.empty()) return std::nullopt;
  // One run first (every rank the same count of runs: the slowest rank's first run decides).
  double first = time_cpu_gemm_sequence(block, 1, [&] { world.barrier(); }).front();
  world.all_reduce(&first, &first, 1, comm::DataType::f64, comm::ReduceOp::max);
  const int repetitions =
      std::clamp(static_cast<int>(std::ceil(kStragglerSeconds / std::max(first, 1e-9))), 8, 40);
  const std::vector<double> times =
      time_cpu_gemm_sequence(block, repetitions, [&] { world.barrier(); });
  std::vector<double> slowest(times.size()), sum(times.size());
  world.all_reduce(times.data(), slowest.data(), times.size(), comm::DataType::f64,
                   comm::ReduceOp::max);
  world.all_reduce(times.data(), sum.data(), times.size(), comm::DataType::f64,
                   comm::ReduceOp::sum);
  double waited = 0, computed = 0;
  std::vector<double> means;
  for (std::size_t i = 0; i < times.size(); ++i) {
    const double mean = sum[i] / ranks;
    waited += slowest[i] - mean;
    computed += mean;
    means.push_back(mean);
  }
  std::nth_element(means.begin(), means.begin() + means.size() / 2, means.end());
  return documents::StragglerWait{waited / computed, ranks, means[means.size() / 2], repetitions};
}

}  // namespace

ComputeCalibration measure_compute(const ComputeSettings& settings, comm::Communicator& host_world,
                                   comm::Communicator& backend_world) {
  ComputeCalibration c;
#if defined(SHARDPLAN_HAVE_NCCL)
  if (auto* nccl = dynamic_cast<comm::NcclCommunicator*>(&backend_world)) {
    const auto info = cuda_device_info(nccl->device());
    c.device = info.name;
    c.cpu_device = false;
    c.device_memory_bytes = info.memory_bytes;
    c.model_dtype = documents::DType::bf16;
    if (settings.gemm) {
      host_world.barrier();
      c.gemm = measure_cublas_gemms(settings.model_shapes, {documents::DType::bf16}, true,
                                    nccl->stream());
      auto squares = measure_cublas_gemms(square_gemm_shapes(true),
                                          {documents::DType::bf16, documents::DType::fp16,
                                           documents::DType::tf32, documents::DType::fp32},
                                          false, nccl->stream());
      c.gemm.insert(c.gemm.end(), squares.begin(), squares.end());
      keep_slowest(host_world, c.gemm);
    }
    if (settings.attention) {
      c.attention = time_cuda_attention(nccl->device(), *settings.attention, kAttentionSeconds,
                                        [&] { host_world.barrier(); });
      keep_slowest(host_world, c.attention);
    }
    if (settings.memory) {
      host_world.barrier();
      c.memory_bandwidth_Bps = slowest_rate(
          host_world, measure_device_copy_bandwidth(kGpuCopyBytes, 10, nccl->stream()));
      host_world.barrier();
      c.host_link_Bps = slowest_rate(
          host_world, measure_host_to_device_bandwidth(kHostLinkBytes, 5, nccl->stream()));
      host_world.barrier();
      c.optimizer_params_per_s = slowest_rate(host_world, measure_cpu_adam_rate(kAdamParams, 3));
    }
    return c;
  }
#endif
  (void)backend_world;
  c.device = cpu_model_name().empty() ? "CPU" : cpu_model_name();
  if (settings.gemm) {
    c.gemm = cpu_gemms(settings.model_shapes, true, host_world);
    auto squares = cpu_gemms(square_gemm_shapes(false), false, host_world);
    c.gemm.insert(c.gemm.end(), squares.begin(), squares.end());
    keep_slowest(host_world, c.gemm);
    c.straggler_wait = measure_straggler_wait(settings.model_shapes, host_world);
    if (!settings.elementwise_ops.empty()) {
      host_world.barrier();
      c.elementwise_elems_per_s =
          slowest_rate(host_world, time_cpu_elementwise_rate(settings.elementwise_ops,
                                                             settings.tokens, settings.head_dim));
    }
  }
  if (settings.attention) {
    c.attention =
        time_cpu_attention(*settings.attention, kAttentionSeconds, [&] { host_world.barrier(); });
    keep_slowest(host_world, c.attention);
  }
  if (settings.memory) {
    host_world.barrier();
    c.memory_bandwidth_Bps = slowest_rate(host_world, measure_cpu_copy_bandwidth(kCpuCopyBytes, 5));
    host_world.barrier();
    c.optimizer_params_per_s = slowest_rate(host_world, measure_cpu_adam_rate(kAdamParams, 3));
  }
  return c;
}

}  // namespace shardplan::calibrate
