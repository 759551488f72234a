// What the GPU kernel tests share: CUDA errors as exceptions, a device array freed at scope exit, a
// stream with a cuBLAS handle bound to it (the kernels' Launch), seeded random inputs, and an
// element-wise comparison that reports how many elements are off.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "kernels/cuda/device_kernels.hpp"

namespace shardplan::executor::testing {

using Floats = std::vector<float>;
using Tokens = std::vector<std::int32_t>;

inline void require_cuda(cudaError_t code, const char* call) {
  if (code != cudaSuccess)
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(code));
}

// A device array of `count` T, freed when it goes out of scope.
template <class T> class DeviceArray {
public:
  explicit DeviceArray(std::size_t count) : count_(count) {
    require_cuda(cudaMalloc(&data_, std::max<std::size_t>(count, 1) * sizeof(T)), "cudaMalloc");
  }
  explicit DeviceArray(const std::vector<T>& values) : DeviceArray(values.size()) {
    upload(values);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(data_); }

  T* get() const { return static_cast<T*>(data_); }
  void upload(const std::vector<T>& values) {
    REQUIRE(values.size() == count_);
    require_cuda(cudaMemcpy(data_, values.data(), count_ * sizeof(T), cudaMemcpyHostToDevice),
                 "cudaMemcpy to the device");
    require_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  void zero() { require_cuda(cudaMemset(data_, 0, count_ * sizeof(T)), "cudaMemset"); }
  // Waits for the device's queued work, then copies.
  std::vector<T> download() const {
    require_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<T> values(count_);
    require_cuda(cudaMemcpy(values.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
                 "cudaMemcpy from the device");
    return values;
  }

private:
  void* data_ = nullptr;
  std::size_t count_;
};

// A stream of its own and a cuBLAS handle bound to it, as the backend sets them up (default math:
// the fp32 GEMMs in full fp32).
class Gpu {
public:
  Gpu() {
    require_cuda(cudaStreamCreate(&stream_), "cudaStreamCreate");
    if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS)
      throw std::runtime_error("cublasCreate failed");
    if (cublasSetStream(blas_, stream_) != CUBLAS_STATUS_SUCCESS)
      throw std::runtime_error("cublasSetStream failed");
    launch_.stream = stream_;
    launch_.blas = blas_;
  }
  Gpu(const Gpu&) = delete;
  Gpu& operator=(const Gpu&) = delete;
  ~Gpu() {
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }
  const kernels::cuda::Launch& launch() const { return launch_; }
  cublasHandle_t blas() const { return blas_; }
  cudaStream_t stream() const { return stream_; }
  // Waits for the queued work; an asynchronous failure of a kernel surfaces here.
  void finish() const {
    require_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    require_cuda(cudaGetLastError(), "a queued kernel");
  }

private:
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  kernels::cuda::Launch launch_;
};

// `count` floats uniform in [low, high), the same for the same seed.
inline Floats random_floats(std::int64_t count, unsigned seed, float low = -1.0f,
                            float high = 1.0f) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> uniform(low, high);
  Floats values(static_cast<std::size_t>(count));
  for (auto& v : values) v = uniform(generator);
  return values;
}

// `count` tokens uniform in [0, below), the same for the same seed.
inline Tokens random_tokens(std::int64_t count, std::int32_t below, unsigned seed) {
  std::mt19937 generator(seed);
  std::uniform_int_distribution<std::int32_t> uniform(0, below - 1);
  Tokens values(static_cast<std::size_t>(count));
  for (auto& v : values) v = uniform(generator);
  return values;
}

// Every element passes within(got_i, want_i, i, scale), scale = max |want|; reports how many do
// not, and the first.
template <class Within>
void check_elements(const Floats& got, const Floats& want, const std::string& what, Within within) {
  REQUIRE(got.size() == want.size());
  double scale = 0.0;
  for (float w : want) scale = std::max(scale, std::fabs(static_cast<double>(w)));
  std::size_t wrong = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!within(static_cast<double>(got[i]), static_cast<double>(want[i]), i, scale)) {
      if (wrong == 0) first = i;
      ++wrong;
    }
  }
  INFO(what << ": " << wrong << " of " << got.size() << " elements differ; first at " << first
            << ": got " << (got.empty() ? 0.0f : got[first]) << ", want "
            << (want.empty() ? 0.0f : want[first]));
  CHECK(wrong == 0);
}

}  // namespace shardplan::executor::testing
