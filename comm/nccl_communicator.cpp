#include "comm/nccl_communicator.hpp"

#include <atomic>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "comm/comm_error.hpp"
#include "comm/cuda_check.hpp"
#include "comm/process_identity.hpp"
#include "comm/tcp_exchange.hpp"

#define SHARDPLAN_NCCL_CALL(communicator, function, ...)                                           \
  ::shardplan::comm::check_nccl(function(__VA_ARGS__), #function, communicator, __FILE__, __LINE__)
// A collective of this communicator, refused once it is aborted (NcclCommunicator::enqueue).
#define SHARDPLAN_NCCL_ENQUEUE(function, ...)                                                      \
  enqueue(#function, [&] { return function(__VA_ARGS__); })

namespace shardplan::comm {
namespace {

ncclDataType_t nccl_type(DataType type) {
  switch (type) {
  case DataType::f32:
    return ncclFloat32;
  case DataType::f64:
    return ncclFloat64;
  case DataType::bf16:
    return ncclBfloat16;
  case DataType::f16:
    return ncclFloat16;
  case DataType::i32:
    return ncclInt32;
  case DataType::i64:
    return ncclInt64;
  case DataType::u8:
    return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
  case ReduceOp::sum:
    return ncclSum;
  case ReduceOp::max:
    return ncclMax;
  case ReduceOp::min:
    return ncclMin;
  }
  return ncclSum;
}

class DeviceBuffer final : public CommBuffer {
public:
  DeviceBuffer(int device, std::size_t bytes) : device_(device), bytes_(bytes) {
    SHARDPLAN_CUDA_CALL(cudaSetDevice, device_);
    SHARDPLAN_CUDA_CALL(cudaMalloc, &data_, bytes == 0 ? 1 : bytes);
  }
  ~DeviceBuffer() override { cudaFree(data_); }
  void* data() override { return data_; }
  std::size_t bytes() const override { return bytes_; }
  void do_copy_from_host(const void* source, std::size_t bytes, std::size_t offset) override {
    if (offset > bytes_ || bytes > bytes_ - offset)
      throw CommError("copy_from_host: beyond the end of the device buffer", __FILE__, __LINE__);
    SHARDPLAN_CUDA_CALL(cudaSetDevice, device_);
    SHARDPLAN_CUDA_CALL(cudaMemcpy, static_cast<std::byte*>(data_) + offset, source, bytes,
                        cudaMemcpyHostToDevice);
    // From pageable memory cudaMemcpy may return before the device has the data, and the
    // communicator's stream does not wait for the default stream: wait here.
    SHARDPLAN_CUDA_CALL(cudaStreamSynchronize, nullptr);
  }
  void do_copy_to_host(void* destination, std::size_t bytes, std::size_t offset) const override {
    if (offset > bytes_ || bytes > bytes_ - offset)
      throw CommError("copy_to_host: beyond the end of the device buffer", __FILE__, __LINE__);
    SHARDPLAN_CUDA_CALL(cudaSetDevice, device_);
    SHARDPLAN_CUDA_CALL(cudaMemcpy, destination, static_cast<const std::byte*>(data_) + offset,
                        bytes, cudaMemcpyDeviceToHost);
  }

private:
  int device_;
  std::size_t bytes_;
  void* data_ = nullptr;
};

const std::byte* block(const void* base, std::size_t index, std::size_t count, DataType type) {
  return static_cast<const std::byte*>(base) + index * count * element_bytes(type);
}
std::byte* block(void* base, std::size_t index, std::size_t count, DataType type) {
  return static_cast<std::byte*>(base) + index * count * element_bytes(type);
}

// Non-blocking communicators (ncclConfig_t.blocking = 0, NCCL 2.14+): every call returns at once,
// possibly with ncclInProgress, and the communicator's state is polled with ncclCommGetAsyncError
// until it leaves ncclInProgress. So no NCCL call of this rank blocks the thread that made it, and
// the watchdog's ncclCommAbort, from its own thread, never waits for (or races) a call in flight.
ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

// Polls a communicator that has just been created (ncclCommInitRankConfig, ncclCommSplit) until it
// is ready; nothing can abort it yet.
void wait_until_created(ncclComm_t comm, const char* call) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    // A creation that failed on its way may leave no communicator to poll; NCCL then answers the
    // poll itself with the error, which is the creation's.
    const ncclResult_t polled = ncclCommGetAsyncError(comm, &state);
    if (polled != ncclSuccess) check_nccl(polled, call, nullptr, __FILE__, __LINE__);
    if (state != ncclInProgress) {
      check_nccl(state, call, comm, __FILE__, __LINE__);
      return;
    }
    std::this_thread::yield();
  }
}

// ncclCommInitRankConfig with the non-blocking config, waited for.
ncclComm_t init_rank(int ranks, const ncclUniqueId& id, int rank) {
  ncclConfig_t config = nonblocking_config();
  ncclComm_t comm = nullptr;
  const ncclResult_t started = ncclCommInitRankConfig(&comm, ranks, id, rank, &config);
  if (started != ncclInProgress)
    check_nccl(started, "ncclCommInitRankConfig", comm, __FILE__, __LINE__);
  wait_until_created(comm, "ncclCommInitRankConfig");
  return comm;
}

}  // namespace

void check_nccl(ncclResult_t code, const char* call, ncclComm_t comm, const char* file, int line) {
  if (code == ncclSuccess) return;
  std::string message = fmt::format("{} failed: {}", call, ncclGetErrorString(code));
  // NCCL's last warning of this thread (its comm argument is unused: nccl.h), also where the call
  // failed before a communicator existed.
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') message += fmt::format(" ({})", last);
  throw CommError(message, file, line);
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(Communicator& host_group,
                                                           int local_rank) {
  const int devices = cuda_device_count();
  if (devices == 0)
    throw CommError("NCCL backend: no CUDA device on this host", __FILE__, __LINE__);
  const int device = local_rank % devices;
  SHARDPLAN_CUDA_CALL(cudaSetDevice, device);
  ncclUniqueId id{};
  if (host_group.rank() == 0) SHARDPLAN_NCCL_CALL(nullptr, ncclGetUniqueId, &id);
  host_group.broadcast(&id, sizeof id, DataType::u8, 0);
  ncclComm_t comm = init_rank(host_group.size(), id, host_group.rank());
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(comm, device, host_group.split(0, host_group.rank())));
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create_alone(int device) {
  if (device < 0 || device >= cuda_device_count())
    throw CommError(fmt::format("NCCL backend: no CUDA device {} on this host", device), __FILE__,
                    __LINE__);
  SHARDPLAN_CUDA_CALL(cudaSetDevice, device);
  ncclUniqueId id{};
  SHARDPLAN_NCCL_CALL(nullptr, ncclGetUniqueId, &id);
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(init_rank(1, id, 0), device, nullptr));
}

std::unique_ptr<NcclCommunicator>
NcclCommunicator::create_from_environment(const LaunchEnvironment& environment, double timeout_s) {
  set_process_rank(environment.rank);  // for the host and rank in every CommError from here on
  const int devices = cuda_device_count();
  if (devices == 0)
    throw CommError("NCCL backend: no CUDA device on this host", __FILE__, __LINE__);
  const int device = environment.local_rank % devices;
  SHARDPLAN_CUDA_CALL(cudaSetDevice, device);
  ncclUniqueId id{};
  if (environment.rank == 0) SHARDPLAN_NCCL_CALL(nullptr, ncclGetUniqueId, &id);
  const auto shared = tcp_share_blob(environment, std::as_bytes(std::span(&id, 1)), timeout_s);
  if (shared.size() != sizeof id)
    throw CommError(fmt::format("NCCL backend: rank 0 sent a {}-byte id, not {} bytes",
                                shared.size(), sizeof id),
                    __FILE__, __LINE__);
  std::memcpy(&id, shared.data(), sizeof id);
  ncclComm_t comm = init_rank(environment.world_size, id, environment.rank);
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(comm, device, nullptr));
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, int device,
                                   std::unique_ptr<Communicator> host_group)
    : comm_(comm), device_(device), host_group_(std::move(host_group)) {
  SHARDPLAN_CUDA_CALL(cudaSetDevice, device_);
  SHARDPLAN_CUDA_CALL(cudaStreamCreateWithFlags, &stream_, cudaStreamNonBlocking);
  SHARDPLAN_NCCL_CALL(comm_, ncclCommUserRank, comm_, &rank_);
  SHARDPLAN_NCCL_CALL(comm_, ncclCommCount, comm_, &size_);
}

NcclCommunicator::~NcclCommunicator() {
  // Destructors cannot report failures; the results are deliberately ignored here. An aborted
  // communicator is already freed, and its stream's kernels may never complete.
  if (aborted_) {
    (void)cudaStreamDestroy(stream_);
    return;
  }
  if (stream_ != nullptr) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  if (barrier_scratch_ != nullptr) (void)cudaFree(barrier_scratch_);
  // A non-blocking communicator is finalized (its pending work flushed) before it is destroyed.
  ncclResult_t state = ncclCommFinalize(comm_);
  while (state == ncclInProgress && ncclCommGetAsyncError(comm_, &state) == ncclSuccess)
    std::this_thread::yield();
  (void)ncclCommDestroy(comm_);
}

std::string NcclCommunicator::library_version() const {
  int version = 0;
  SHARDPLAN_NCCL_CALL(comm_, ncclGetVersion, &version);
  // Since NCCL 2.9 the code is major·10000 + minor·100 + patch.
  return fmt::format("NCCL {}.{}.{}", version / 10000, version / 100 % 100, version % 100);
}

std::unique_ptr<CommBuffer> NcclCommunicator::allocate(std::size_t bytes) {
  return std::make_unique<DeviceBuffer>(device_, bytes);
}

void NcclCommunicator::do_all_reduce(const void* send, void* recv, std::size_t count, DataType type,
                                     ReduceOp op) {
  SHARDPLAN_NCCL_ENQUEUE(ncclAllReduce, send, recv, count, nccl_type(type), nccl_op(op), comm_,
                         stream_);
}

void NcclCommunicator::do_reduce(const void* send, void* recv, std::size_t count, DataType type,
                                 int root, ReduceOp op) {
  SHARDPLAN_NCCL_ENQUEUE(ncclReduce, send, recv, count, nccl_type(type), nccl_op(op), root, comm_,
                         stream_);
}

void NcclCommunicator::all_gather(const void* send, void* recv, std::size_t count, DataType type) {
  SHARDPLAN_NCCL_ENQUEUE(ncclAllGather, send, recv, count, nccl_type(type), comm_, stream_);
}

void NcclCommunicator::do_reduce_scatter(const void* send, void* recv, std::size_t count,
                                         DataType type, ReduceOp op) {
  SHARDPLAN_NCCL_ENQUEUE(ncclReduceScatter, send, recv, count, nccl_type(type), nccl_op(op), comm_,
                         stream_);
}

void NcclCommunicator::broadcast(void* buffer, std::size_t count, DataType type, int root) {
  SHARDPLAN_NCCL_ENQUEUE(ncclBroadcast, buffer, buffer, count, nccl_type(type), root, comm_,
                         stream_);
}

void NcclCommunicator::all_to_all(const void* send, void* recv, std::size_t count, DataType type) {
  // One send and one receive per peer in a group, as nccl-tests' alltoall does; works on every
  // NCCL with point-to-point (2.7+).
  enqueue("ncclGroupEnd (all-to-all)", [&] {
    SHARDPLAN_NCCL_CALL(comm_, ncclGroupStart);
    for (int peer = 0; peer < size_; ++peer) {
      const auto p = static_cast<std::size_t>(peer);
      SHARDPLAN_NCCL_CALL(comm_, ncclSend, block(send, p, count, type), count, nccl_type(type),
                          peer, comm_, stream_);
      SHARDPLAN_NCCL_CALL(comm_, ncclRecv, block(recv, p, count, type), count, nccl_type(type),
                          peer, comm_, stream_);
    }
    return ncclGroupEnd();
  });
}

// ncclSend/ncclRecv each in a group of its own, as NCCL's documentation pairs them
// (docs: "Point-to-point communication"); a lone send waits on the stream for its receiver.
void NcclCommunicator::do_send(const void* buffer, std::size_t count, DataType type, int peer) {
  enqueue("ncclGroupEnd (send)", [&] {
    SHARDPLAN_NCCL_CALL(comm_, ncclGroupStart);
    SHARDPLAN_NCCL_CALL(comm_, ncclSend, buffer, count, nccl_type(type), peer, comm_, stream_);
    return ncclGroupEnd();
  });
}

void NcclCommunicator::do_recv(void* buffer, std::size_t count, DataType type, int peer) {
  enqueue("ncclGroupEnd (recv)", [&] {
    SHARDPLAN_NCCL_CALL(comm_, ncclGroupStart);
    SHARDPLAN_NCCL_CALL(comm_, ncclRecv, buffer, count, nccl_type(type), peer, comm_, stream_);
    return ncclGroupEnd();
  });
}

void NcclCommunicator::do_send_recv(const void* send_buffer, std::size_t send_count, int send_peer,
                                    void* recv_buffer, std::size_t recv_count, int recv_peer,
                                    DataType type) {
  enqueue("ncclGroupEnd (send_recv)", [&] {
    SHARDPLAN_NCCL_CALL(comm_, ncclGroupStart);
    SHARDPLAN_NCCL_CALL(comm_, ncclSend, send_buffer, send_count, nccl_type(type), send_peer, comm_,
                        stream_);
    SHARDPLAN_NCCL_CALL(comm_, ncclRecv, recv_buffer, recv_count, nccl_type(type), recv_peer, comm_,
                        stream_);
    return ncclGroupEnd();
  });
}

void NcclCommunicator::synchronize() {
  // Polls rather than blocking in cudaStreamSynchronize, as PyTorch's NCCL watchdog does: when a
  // peer fails, the stream never completes and only NCCL's asynchronous error says why; and a
  // communicator aborted by the watchdog ends the wait here.
  for (;;) {
    {
      std::lock_guard lock(abort_mutex_);
      throw_if_aborted();
      ncclResult_t async_error = ncclSuccess;
      SHARDPLAN_NCCL_CALL(comm_, ncclCommGetAsyncError, comm_, &async_error);
      check_nccl(async_error, "NCCL (asynchronous error)", comm_, __FILE__, __LINE__);
    }
    const cudaError_t state = cudaStreamQuery(stream_);
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) check_cuda(state, "cudaStreamQuery", __FILE__, __LINE__);
    std::this_thread::yield();
  }
}

template <class Call> void NcclCommunicator::enqueue(const char* call, Call&& start) {
  {
    std::lock_guard lock(abort_mutex_);
    throw_if_aborted();
    const ncclResult_t started = start();
    if (started != ncclInProgress) {
      check_nccl(started, call, comm_, __FILE__, __LINE__);
      return;
    }
  }
  // Queued but not yet accepted: polled with the lock released between polls, so that an abort
  // from the watchdog's thread can come in.
  for (;;) {
    {
      std::lock_guard lock(abort_mutex_);
      throw_if_aborted();
      ncclResult_t state = ncclSuccess;
      SHARDPLAN_NCCL_CALL(comm_, ncclCommGetAsyncError, comm_, &state);
      if (state != ncclInProgress) {
        check_nccl(state, call, comm_, __FILE__, __LINE__);
        return;
      }
    }
    std::this_thread::yield();
  }
}

void NcclCommunicator::throw_if_aborted() const {
  if (aborted_)
    throw CommError("NCCL communicator aborted (a rank failed or stopped)", __FILE__, __LINE__);
}

void NcclCommunicator::abort() {
  std::lock_guard lock(abort_mutex_);
  if (aborted_.exchange(true)) return;
  (void)ncclCommAbort(comm_);  // the job ends next; there is no one to report a failure to
}

void NcclCommunicator::barrier() {
  synchronize();
  if (host_group_ != nullptr) {
    host_group_->barrier();
    return;
  }
  // No host group (started from the environment): an all-reduce of one int completes on a rank
  // only once every rank has joined it, which is a barrier; synchronize() waits for it here.
  if (barrier_scratch_ == nullptr) {
    SHARDPLAN_CUDA_CALL(cudaSetDevice, device_);
    SHARDPLAN_CUDA_CALL(cudaMalloc, &barrier_scratch_, sizeof(int));
    SHARDPLAN_CUDA_CALL(cudaMemsetAsync, barrier_scratch_, 0, sizeof(int), stream_);
  }
  SHARDPLAN_NCCL_ENQUEUE(ncclAllReduce, barrier_scratch_, barrier_scratch_, 1, ncclInt32, ncclSum,
                         comm_, stream_);
  synchronize();
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  ncclComm_t part = nullptr;
  // A null config: the new communicator inherits this one's (non-blocking).
  enqueue("ncclCommSplit", [&] { return ncclCommSplit(comm_, color, key, &part, nullptr); });
  // Non-blocking, NCCL's creation job writes the new communicator into `part` when it ends, with
  // or without success (NCCL 2.28's init.cc, ncclCommInitRankFunc: an atomic store), not when
  // ncclCommSplit returns: until then `part` is null, and this one's errors are the split's.
  const std::atomic_ref<ncclComm_t> created(part);
  while (created.load(std::memory_order_acquire) == nullptr) {
    {
      std::lock_guard lock(abort_mutex_);
      throw_if_aborted();
      ncclResult_t state = ncclSuccess;
      SHARDPLAN_NCCL_CALL(comm_, ncclCommGetAsyncError, comm_, &state);
      if (state != ncclInProgress) check_nccl(state, "ncclCommSplit", comm_, __FILE__, __LINE__);
    }
    std::this_thread::yield();
  }
  wait_until_created(part, "ncclCommSplit");
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(
      part, device_, host_group_ != nullptr ? host_group_->split(color, key) : nullptr));
}

}  // namespace shardplan::comm
