#include "calibrate/cuda_bench.hpp"

#include <cublas_v2.h>

#include <algorithm>

#include <fmt/format.h>

#include "comm/comm_error.hpp"
#include "comm/cuda_check.hpp"

#define SHARDPLAN_CUBLAS_CALL(function, ...)                                                       \
  check_cublas(function(__VA_ARGS__), #function, __FILE__, __LINE__)

namespace shardplan::calibrate {
namespace {

using documents::DType;

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw comm::CommError(fmt::format("{} failed: {}", call, cublasGetStatusString(status)), file,
                        line);
}

// Device memory freed on scope exit.
class DeviceMemory {
public:
  explicit DeviceMemory(std::size_t bytes) {
    SHARDPLAN_CUDA_CALL(cudaMalloc, &data_, std::max<std::size_t>(bytes, 1));
  }
  ~DeviceMemory() { (void)cudaFree(data_); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* get() const { return data_; }

private:
  void* data_ = nullptr;
};

class EventPair {
public:
  EventPair() {
    SHARDPLAN_CUDA_CALL(cudaEventCreate, &begin_);
    SHARDPLAN_CUDA_CALL(cudaEventCreate, &end_);
  }
  ~EventPair() {
    (void)cudaEventDestroy(begin_);
    (void)cudaEventDestroy(end_);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  void start(cudaStream_t s) { SHARDPLAN_CUDA_CALL(cudaEventRecord, begin_, s); }
  double stop_seconds(cudaStream_t s) {
    SHARDPLAN_CUDA_CALL(cudaEventRecord, end_, s);
    SHARDPLAN_CUDA_CALL(cudaEventSynchronize, end_);
    float ms = 0;
    SHARDPLAN_CUDA_CALL(cudaEventElapsedTime, &ms, begin_, end_);
    return static_cast<double>(ms) * 1e-3;
  }

private:
  cudaEvent_t begin_ = nullptr;
  cudaEvent_t end_ = nullptr;
};

struct GemmTypes {
  cudaDataType_t storage;
  cublasComputeType_t compute;
};

GemmTypes gemm_types(DType d) {
  switch (d) {
  case DType::bf16:
    return {CUDA_R_16BF, CUBLAS_COMPUTE_32F};
  case DType::fp16:
    return {CUDA_R_16F, CUBLAS_COMPUTE_32F};
  case DType::tf32:
    return {CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32};
  case DType::fp32:
    return {CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC};
  }
  return {CUDA_R_32F, CUBLAS_COMPUTE_32F};
}

}  // namespace

CudaDeviceInfo cuda_device_info(int device) {
  cudaDeviceProp properties{};
  SHARDPLAN_CUDA_CALL(cudaGetDeviceProperties, &properties, device);
  return {properties.name, static_cast<double>(properties.totalGlobalMem)};
}

std::vector<GemmMeasurement> measure_cublas_gemms(const std::vector<GemmShape>& shapes,
                                                  const std::vector<DType>& dtypes,
                                                  bool model_shapes, cudaStream_t stream) {
  constexpr int kWarmup = 2, kRuns = 10;
  std::size_t largest = 0;
  for (const auto& s : shapes)
    largest = std::max({largest, static_cast<std::size_t>(s.m * s.k),
                        static_cast<std::size_t>(s.k * s.n), static_cast<std::size_t>(s.m * s.n)});
  DeviceMemory a(largest * 4), b(largest * 4), c(largest * 4);
  // Small nonzero values (0x3C bytes): zeros would let the GPU run cooler than real data does.
  for (void* p : {a.get(), b.get(), c.get()})
    SHARDPLAN_CUDA_CALL(cudaMemsetAsync, p, 0x3C, largest * 4, stream);
  cublasHandle_t handle = nullptr;
  SHARDPLAN_CUBLAS_CALL(cublasCreate, &handle);
  std::vector<GemmMeasurement> results;
  try {
    SHARDPLAN_CUBLAS_CALL(cublasSetStream, handle, stream);
    EventPair events;
    const float alpha = 1.0f, beta = 0.0f;
    for (DType dtype : dtypes) {
      const GemmTypes types = gemm_types(dtype);
      for (const auto& s : shapes) {
        const auto m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
        auto gemm = [&] {
          SHARDPLAN_CUBLAS_CALL(cublasGemmEx, handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha,
                                a.get(), types.storage, m, b.get(), types.storage, k, &beta,
                                c.get(), types.storage, m, types.compute, CUBLAS_GEMM_DEFAULT);
        };
        for (int i = 0; i < kWarmup; ++i) gemm();
        events.start(stream);
        for (int i = 0; i < kRuns; ++i) gemm();
        results.push_back({s, dtype, events.stop_seconds(stream) / kRuns, model_shapes});
      }
    }
  } catch (...) {
    (void)cublasDestroy(handle);
    throw;
  }
  SHARDPLAN_CUBLAS_CALL(cublasDestroy, handle);
  return results;
}

double measure_device_copy_bandwidth(std::size_t bytes, int repetitions, cudaStream_t stream) {
  DeviceMemory source(bytes), destination(bytes);
  SHARDPLAN_CUDA_CALL(cudaMemcpyAsync, destination.get(), source.get(), bytes,
                      cudaMemcpyDeviceToDevice, stream);
  EventPair events;
  events.start(stream);
  for (int i = 0; i < repetitions; ++i)
    SHARDPLAN_CUDA_CALL(cudaMemcpyAsync, destination.get(), source.get(), bytes,
                        cudaMemcpyDeviceToDevice, stream);
  return 2.0 * static_cast<double>(bytes) * repetitions / events.stop_seconds(stream);
}

double measure_host_to_device_bandwidth(std::size_t bytes, int repetitions, cudaStream_t stream) {
  void* host = nullptr;
  SHARDPLAN_CUDA_CALL(cudaMallocHost, &host, bytes);
  double rate = 0;
  try {
    DeviceMemory device(bytes);
    SHARDPLAN_CUDA_CALL(cudaMemcpyAsync, device.get(), host, bytes, cudaMemcpyHostToDevice, stream);
    EventPair events;
    events.start(stream);
    for (int i = 0; i < repetitions; ++i)
      SHARDPLAN_CUDA_CALL(cudaMemcpyAsync, device.get(), host, bytes, cudaMemcpyHostToDevice,
                          stream);
    rate = static_cast<double>(bytes) * repetitions / events.stop_seconds(stream);
  } catch (...) {
    (void)cudaFreeHost(host);
    throw;
  }
  SHARDPLAN_CUDA_CALL(cudaFreeHost, host);
  return rate;
}

}  // namespace shardplan::calibrate
