#include "kernels/cuda/device_memory.hpp"

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "comm/comm_error.hpp"

namespace shardplan::kernels::cuda {
namespace {

void check(cudaError_t code, const char* call, const char* file, int line) {
  if (code == cudaSuccess) return;
  throw comm::CommError(
      fmt::format("{} failed: {}: {}", call, cudaGetErrorName(code), cudaGetErrorString(code)),
      file, line);
}
#define DEVICE_MEMORY_CALL(function, ...)                                                          \
  check(function(__VA_ARGS__), #function, __FILE__, __LINE__)

std::string describe_bytes(std::int64_t bytes) {
  return fmt::format("{} bytes ({:.2f} MiB)", bytes,
                     static_cast<double>(bytes) / (1024.0 * 1024.0));
}

int current_device() {
  int device = 0;
  DEVICE_MEMORY_CALL(cudaGetDevice, &device);
  return device;
}

// Makes `device` the calling thread's current device for a scope (a communication thread starts
// on device 0), and the previous one current again at its end.
class DeviceGuard {
public:
  explicit DeviceGuard(int device) : device_(device), previous_(current_device()) {
    if (previous_ != device_) DEVICE_MEMORY_CALL(cudaSetDevice, device_);
  }
  ~DeviceGuard() {
    if (previous_ != device_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

private:
  int device_;
  int previous_;
};

}  // namespace

DeviceOutOfMemory::DeviceOutOfMemory(std::int64_t bytes, int device)
    : message_(fmt::format("cudaMalloc of {} on device {} failed: out of memory",
                           describe_bytes(bytes), device)) {}

void* CudaSegmentSource::map(std::int64_t bytes) {
  DeviceGuard guard(device_);
  void* p = nullptr;
  const cudaError_t code = cudaMalloc(&p, static_cast<std::size_t>(bytes));
  if (code == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it, so that no later check reports it
    throw DeviceOutOfMemory(bytes, device_);
  }
  check(code, "cudaMalloc", __FILE__, __LINE__);
  return p;
}

void CudaSegmentSource::unmap(void* p, std::int64_t bytes) noexcept {
  try {
    DeviceGuard guard(device_);
    // Fenced work may still use the segment: let the device finish before the memory goes.
    DEVICE_MEMORY_CALL(cudaDeviceSynchronize);
    DEVICE_MEMORY_CALL(cudaFree, p);
  } catch (const std::exception& e) {
    try {
      std::lock_guard lock(mutex_);
      if (error_.empty())
        error_ = fmt::format("freeing a segment of {}: {}", describe_bytes(bytes), e.what());
    } catch (...) {
    }
  }
}

std::string CudaSegmentSource::take_error() {
  std::lock_guard lock(mutex_);
  return std::exchange(error_, {});
}

DeviceMemory::DeviceMemory(std::int64_t limit_bytes)
    : device_(current_device()), source_(device_), pool_(source_, limit_bytes) {}

DeviceMemory::~DeviceMemory() {
  try {
    DeviceGuard guard(device_);
    (void)cudaDeviceSynchronize();
    for (cudaEvent_t e : all_events_) (void)cudaEventDestroy(e);
  } catch (...) {
  }
  // pool_ is destroyed next and frees every segment through source_.
}

void* DeviceMemory::allocate(std::int64_t bytes, bool zero) {
  return allocate_on(stream(), bytes, zero);
}

void* DeviceMemory::allocate_on(cudaStream_t stream, std::int64_t bytes, bool zero) {
  throw_deferred_error();
  DeviceGuard guard(device_);
  CachingPool::Allocation block = pool_.allocate(bytes, stream);
  cudaError_t code = cudaSuccess;
  const char* call = "";
  for (const Fence& fence : block.fences) {
    if (fence.stream == stream) continue;  // recorded on this stream: its order covers it
    code = cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(fence.event), 0);
    if (code != cudaSuccess) {
      call = "cudaStreamWaitEvent";
      break;
    }
  }
  if (code == cudaSuccess && zero) {
    code = cudaMemsetAsync(block.ptr, 0, static_cast<std::size_t>(bytes), stream);
    call = "cudaMemsetAsync";
  }
  // A queued wait holds the event's state at the call; recording the event again later does not
  // change it (CUDA runtime API, cudaEventRecord): the events may be handed out again now.
  pool_.release_fences(block.fences);
  recycle(pool_.take_unused_events());
  // On a failure the block stays out of the pool (counted as allocated): whether its waits were
  // queued is not known, so no stream may have it.
  check(code, call, __FILE__, __LINE__);
  return block.ptr;
}

void DeviceMemory::free(void* data, std::int64_t /*bytes*/) noexcept {
  if (data == nullptr) return;
  std::lock_guard lock(mutex_);  // records and frees in one order (CachingPool::free)
  std::vector<void*> streams;
  std::vector<Fence> fences;
  std::string failure;
  try {
    DeviceGuard guard(device_);
    streams = pool_.streams_of(data);
    fences.reserve(streams.size());
    for (void* s : streams) {
      cudaEvent_t event = take_event();
      fences.push_back({s, event});
      DEVICE_MEMORY_CALL(cudaEventRecord, event, static_cast<cudaStream_t>(s));
    }
    pool_.free(data, fences);
    return;
  } catch (const std::exception& e) {
    failure = e.what();
  }
  // No fences: the events go back unrecorded, and the block goes back only once its streams are
  // idle. If even that fails, it stays out of the pool for good.
  try {
    for (const Fence& fence : fences) free_events_.push_back(static_cast<cudaEvent_t>(fence.event));
    bool idle = !streams.empty();
    for (void* s : streams)
      if (cudaStreamSynchronize(static_cast<cudaStream_t>(s)) != cudaSuccess) idle = false;
    if (idle) pool_.free(data, {});
    if (deferred_error_.empty())
      deferred_error_ = fmt::format("freeing device memory at {}: {}", data, failure);
  } catch (...) {
  }
}

void DeviceMemory::write(void* dst, const void* host, std::int64_t bytes) {
  if (bytes <= 0) return;
  const cudaStream_t s = stream();
  DeviceGuard guard(device_);
  DEVICE_MEMORY_CALL(cudaMemcpyAsync, dst, host, static_cast<std::size_t>(bytes),
                     cudaMemcpyHostToDevice, s);
  DEVICE_MEMORY_CALL(cudaStreamSynchronize, s);
}

void DeviceMemory::read(void* host, const void* src, std::int64_t bytes) {
  if (bytes <= 0) return;
  const cudaStream_t s = stream();
  DeviceGuard guard(device_);
  DEVICE_MEMORY_CALL(cudaMemcpyAsync, host, src, static_cast<std::size_t>(bytes),
                     cudaMemcpyDeviceToHost, s);
  DEVICE_MEMORY_CALL(cudaStreamSynchronize, s);
}

void DeviceMemory::copy(void* dst, const void* src, std::int64_t bytes) {
  if (bytes <= 0 || dst == src) return;
  const cudaStream_t s = stream();
  DeviceGuard guard(device_);
  const auto to = reinterpret_cast<std::uintptr_t>(dst);
  const auto from = reinterpret_cast<std::uintptr_t>(src);
  const auto n = static_cast<std::uintptr_t>(bytes);
  if (to + n <= from || from + n <= to) {  // disjoint: cudaMemcpy's contract
    DEVICE_MEMORY_CALL(cudaMemcpyAsync, dst, src, n, cudaMemcpyDeviceToDevice, s);
    return;
  }
  // memmove's semantics through a staging block, piece by piece: forwards when dst is below src,
  // backwards when above, so that each piece of src is staged before anything overwrites it (a
  // piece written lands only on bytes of src already staged, this piece's or earlier ones').
  const std::int64_t piece = std::min(bytes, kStagingBytes);
  void* staging = allocate_on(s, piece, false);
  struct Release {
    DeviceMemory& memory;
    void* p;
    std::int64_t bytes;
    ~Release() { memory.free(p, bytes); }  // fenced on s: reused after these copies
  } release{*this, staging, piece};
  auto* out = static_cast<char*>(dst);
  const auto* in = static_cast<const char*>(src);
  for (std::int64_t done = 0; done < bytes; done += piece) {
    const std::int64_t len = std::min(piece, bytes - done);
    const std::int64_t offset = to < from ? done : bytes - done - len;
    const auto size = static_cast<std::size_t>(len);
    DEVICE_MEMORY_CALL(cudaMemcpyAsync, staging, in + offset, size, cudaMemcpyDeviceToDevice, s);
    DEVICE_MEMORY_CALL(cudaMemcpyAsync, out + offset, staging, size, cudaMemcpyDeviceToDevice, s);
  }
}

void DeviceMemory::set_stream(cudaStream_t stream) {
  std::lock_guard lock(mutex_);
  stream_ = stream;
}

cudaStream_t DeviceMemory::stream() const {
  std::lock_guard lock(mutex_);
  return stream_;
}

void DeviceMemory::record_use(void* p, cudaStream_t stream) { pool_.record_use(p, stream); }

void DeviceMemory::set_limit(std::int64_t limit_bytes) { pool_.set_limit(limit_bytes); }

std::int64_t DeviceMemory::limit() const { return pool_.limit(); }

std::int64_t DeviceMemory::release_cached() {
  const std::int64_t released = pool_.release_cached();
  recycle(pool_.take_unused_events());
  throw_deferred_error();  // a cudaFree that failed
  return released;
}

void DeviceMemory::reset_peaks() { pool_.reset_peaks(); }

PoolStats DeviceMemory::stats() const { return pool_.stats(); }

std::int64_t DeviceMemory::used_by_others() const {
  DeviceGuard guard(device_);
  std::size_t free = 0, total = 0;
  DEVICE_MEMORY_CALL(cudaMemGetInfo, &free, &total);
  return static_cast<std::int64_t>(total - free) - reserved_bytes();
}

DeviceMemoryInfo DeviceMemory::measure(const std::function<void()>& step) {
  std::size_t free = 0, total = 0;
  DEVICE_MEMORY_CALL(cudaMemGetInfo, &free, &total);
  DeviceMemoryInfo info;
  info.total = static_cast<std::int64_t>(total);
  info.free_before = static_cast<std::int64_t>(free);
  step();
  DEVICE_MEMORY_CALL(cudaMemGetInfo, &free, &total);
  info.free_after = static_cast<std::int64_t>(free);
  return info;
}

std::int64_t DeviceMemory::context_bytes() {
  DEVICE_MEMORY_CALL(cudaFree, nullptr);  // creates the context if there is none yet
  std::size_t free = 0, total = 0;
  DEVICE_MEMORY_CALL(cudaMemGetInfo, &free, &total);
  return static_cast<std::int64_t>(total - free);
}

cudaEvent_t DeviceMemory::take_event() {
  if (!free_events_.empty()) {
    cudaEvent_t event = free_events_.back();
    free_events_.pop_back();
    return event;
  }
  all_events_.reserve(all_events_.size() + 1);
  free_events_.reserve(all_events_.size() + 1);  // recycling it back never allocates
  cudaEvent_t event = nullptr;
  DEVICE_MEMORY_CALL(cudaEventCreateWithFlags, &event, cudaEventDisableTiming);
  all_events_.push_back(event);
  return event;
}

void DeviceMemory::recycle(const std::vector<void*>& events) {
  std::lock_guard lock(mutex_);
  for (void* e : events) free_events_.push_back(static_cast<cudaEvent_t>(e));
}

void DeviceMemory::throw_deferred_error() {
  std::string error;
  {
    std::lock_guard lock(mutex_);
    error = std::exchange(deferred_error_, {});
  }
  if (error.empty()) error = source_.take_error();
  if (!error.empty()) throw std::runtime_error("device memory: an earlier free failed: " + error);
}

#undef DEVICE_MEMORY_CALL

}  // namespace shardplan::kernels::cuda
