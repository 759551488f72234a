// Compute and memory microbenchmarks of one GPU (built with CUDA only): cuBLAS GEMMs in bf16,
// fp16, tf32 and fp32, device-to-device copy bandwidth and pinned host-to-device bandwidth, all
// timed with CUDA events on the given stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

#include "calibrate/gemm_shapes.hpp"

namespace shardplan::calibrate {

struct CudaDeviceInfo {
  std::string name;         // "NVIDIA H100 80GB HBM3"
  double memory_bytes = 0;  // total device memory
};

CudaDeviceInfo cuda_device_info(int device);
// One measurement per shape and dtype: C = A·B, column-major, fp32 accumulation.
std::vector<GemmMeasurement> measure_cublas_gemms(const std::vector<GemmShape>& shapes,
                                                  const std::vector<documents::DType>& dtypes,
                                                  bool model_shapes, cudaStream_t stream);
// Read + write bytes per second of cudaMemcpyAsync device to device (2 × bytes per copy).
double measure_device_copy_bandwidth(std::size_t bytes, int repetitions, cudaStream_t stream);
// Bytes per second of cudaMemcpyAsync from pinned host memory to the device.
double measure_host_to_device_bandwidth(std::size_t bytes, int repetitions, cudaStream_t stream);

}  // namespace shardplan::calibrate
