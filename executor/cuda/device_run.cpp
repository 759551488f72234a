#include "executor/device_run.hpp"

#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include "core/input_error.hpp"
#include "kernels/caching_pool.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device_memory.hpp"
#include "kernels/memory_source.hpp"
#include "kernels/scalar.hpp"

namespace shardplan::executor {

using kernels::bf16;
using kernels::CachingPool;
using kernels::f16;
using kernels::MemorySource;
namespace {

class CudaDeviceRun final : public DeviceRun {
public:
  CudaDeviceRun(int device, std::int64_t limit_bytes) {
    if (cudaSetDevice(device) != cudaSuccess)
      throw std::runtime_error(fmt::format("cudaSetDevice({}) failed", device));
    context_ = kernels::cuda::DeviceMemory::context_bytes();
    cudaDeviceProp props{};
    if (cudaGetDeviceProperties(&props, device) == cudaSuccess) name_ = props.name;
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) total_ = static_cast<std::int64_t>(total);
    memory_ = std::make_unique<kernels::cuda::DeviceMemory>(
        limit_bytes < 0 ? CachingPool::kUnlimited : limit_bytes);
  }
  ~CudaDeviceRun() override {
    fp32_.reset();  // their streams, before the memory's segments
    bf16_.reset();
    fp16_.reset();
    memory_.reset();
  }

  MemorySource& memory() override { return *memory_; }
  void attach(EngineOptions& options) override {
    switch (documents::compute_dtype(options.precision)) {
    case documents::DType::bf16:
      options.backend_bf16 = &make(bf16_);
      break;
    case documents::DType::fp16:
      options.backend_f16 = &make(fp16_);
      break;
    default:  // the GEMMs in TF32, as the cost model's fp32 precision computes
      options.backend = &make(fp32_);
    }
  }
  void before_communicators() override { used_before_ = used(); }
  void after_communicators() override { nccl_ = used() - used_before_; }
  void reset_peaks() override { memory_->reset_peaks(); }
  DeviceFootprint footprint() const override {
    DeviceFootprint f;
    f.name = name_;
    f.total_bytes = total_;
    f.context_bytes = context_;
    f.nccl_bytes = nccl_;
    const auto s = memory_->stats();
    f.reserved_peak_bytes = s.peak_reserved_bytes;
    f.allocated_peak_bytes = s.peak_allocated_bytes;
    f.segments = s.segments;
    return f;
  }

private:
  static std::int64_t used() {
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
    return static_cast<std::int64_t>(total - free);
  }

  std::string name_;
  std::int64_t total_ = 0, context_ = 0, nccl_ = 0, used_before_ = 0;
  std::unique_ptr<kernels::cuda::DeviceMemory> memory_;
  // One backend per compute type; the pool queues its allocations on the last one made.
  template <class S>
  kernels::cuda::CudaBackend<S>& make(std::unique_ptr<kernels::cuda::CudaBackend<S>>& b) {
    if (!b) b = std::make_unique<kernels::cuda::CudaBackend<S>>(*memory_, true);
    return *b;
  }

  std::unique_ptr<kernels::cuda::CudaBackend<float>> fp32_;
  std::unique_ptr<kernels::cuda::CudaBackend<bf16>> bf16_;
  std::unique_ptr<kernels::cuda::CudaBackend<f16>> fp16_;
};

}  // namespace

std::unique_ptr<DeviceRun> open_device(int device, std::int64_t limit_bytes) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    throw core::InputError("--backend", "cuda: this host has no CUDA device");
  }
  return std::make_unique<CudaDeviceRun>(device % count, limit_bytes);
}

}  // namespace shardplan::executor
