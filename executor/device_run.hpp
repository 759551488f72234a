// The GPU of one rank for the CUDA backend (executor --backend cuda), behind an interface without
// CUDA types so that the run command compiles in every build: the device's memory (a caching
// pool, kernels/cuda/device_memory.hpp), the backend that computes on it, and what was measured
// about the device itself for the cost model's overhead terms:
//
//   context_bytes   cudaMemGetInfo's used bytes once the context exists, before anything else
//                   (the CUDA context; other processes on the GPU are counted too)
//   nccl_bytes      the growth of the used bytes while the NCCL communicators were made
//   reserved        the pool's segments (PyTorch's memory_reserved); allocated: its blocks
//
// A build without CUDA has the same function, which refuses with an InputError for --backend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "executor/engine.hpp"
#include "kernels/backend.hpp"
#include "kernels/memory_source.hpp"

namespace shardplan::executor {

struct DeviceFootprint {
  std::string name;                       // "NVIDIA H200"
  std::int64_t total_bytes = 0;           // the device's memory
  std::int64_t context_bytes = 0;         // see above
  std::int64_t nccl_bytes = 0;            // 0 without communicators (a rehearsal)
  std::int64_t reserved_peak_bytes = 0;   // the pool's highest reserved
  std::int64_t allocated_peak_bytes = 0;  // its highest allocated (requests rounded to 512 B)
  std::int64_t segments = 0;              // cudaMalloc'ed segments held at the end
};

class DeviceRun {
public:
  DeviceRun() = default;
  DeviceRun(const DeviceRun&) = delete;
  DeviceRun& operator=(const DeviceRun&) = delete;
  virtual ~DeviceRun() = default;

  virtual kernels::MemorySource& memory() = 0;
  // Points the options' backend of their precision's compute type (EngineOptions::backend,
  // backend_bf16, backend_f16) at this GPU's, made on first use: fp32 with TF32 GEMMs, as the cost
  // model's fp32 computes (documents/job.cpp); bf16 and fp16 with fp32 accumulation.
  virtual void attach(EngineOptions& options) = 0;
  // Brackets the making of the NCCL communicators: their growth is nccl_bytes.
  virtual void before_communicators() = 0;
  virtual void after_communicators() = 0;
  // Starts the pool's peaks again (after the engine's set-up, before the steps).
  virtual void reset_peaks() = 0;
  virtual DeviceFootprint footprint() const = 0;
};

// Opens GPU `device` (modulo the devices visible) for one rank: makes its context, measures it,
// and sets up the pool (limit_bytes of segments at most; < 0: no limit) and the backend. Throws
// core::InputError (--backend) in a build without CUDA or on a host without a GPU.
std::unique_ptr<DeviceRun> open_device(int device, std::int64_t limit_bytes);

}  // namespace shardplan::executor
