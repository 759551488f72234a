// The NCCL backend: collectives on GPU buffers, one GPU per rank chosen by the rank's local rank,
// queued on the communicator's own CUDA stream. Set up as nccl-tests does: rank 0 makes the unique
// id (ncclGetUniqueId) and broadcasts it over MPI (or, for ranks started by torchrun without MPI,
// over TCP), then every rank calls ncclCommInitRank. It keeps an MPI communicator of the same ranks
// for host-side barriers when it has one. Every CUDA and NCCL result is checked. NCCL up to 2.29
// refuses two ranks of one communicator on the same GPU ("Duplicate GPU detected"), so a machine
// with one GPU runs this backend with one rank only. Communicators are non-blocking (ncclConfig_t
// blocking = 0): no call blocks its thread, and every collective is refused once abort() ran.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "comm/communicator.hpp"
#include "comm/launch_env.hpp"

namespace shardplan::comm {

// Throws CommError naming `call`, NCCL's error text and, when a communicator is given, its last
// error message.
void check_nccl(ncclResult_t code, const char* call, ncclComm_t comm, const char* file, int line);

// CUDA devices visible to this process (0 when there is no driver or no device).
int cuda_device_count();

class NcclCommunicator final : public Communicator {
public:
  // Collective over `host_group` (an MPI group: the unique id is broadcast over it). Throws
  // CommError when this rank has no GPU.
  static std::unique_ptr<NcclCommunicator> create(Communicator& host_group, int local_rank);
  // Without MPI, for ranks started by torchrun (comm/launch_env.hpp): rank 0 makes the unique id
  // and hands it to the others over TCP on MASTER_ADDR:MASTER_PORT (comm/tcp_exchange.hpp),
  // waiting at most `timeout_s` for them (PyTorch's TCPStore waits 300 s by default); the GPU is
  // LOCAL_RANK's. Such a communicator has no host group: its barrier is an NCCL all-reduce.
  static std::unique_ptr<NcclCommunicator>
  create_from_environment(const LaunchEnvironment& environment, double timeout_s = 300);
  // One rank alone on `device`, with no other process to share an id with (a one-GPU check).
  static std::unique_ptr<NcclCommunicator> create_alone(int device);
  ~NcclCommunicator() override;

  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  // Null when created from the environment.
  Communicator* host_group() { return host_group_.get(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }
  std::string library_version() const override;
  MemorySpace memory_space() const override { return MemorySpace::device; }
  void* stream_handle() const override { return stream_; }
  std::unique_ptr<CommBuffer> allocate(std::size_t bytes) override;

  void do_all_reduce(const void* send, void* recv, std::size_t count, DataType type,
                     ReduceOp op) override;
  void do_reduce(const void* send, void* recv, std::size_t count, DataType type, int root,
                 ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::size_t count, DataType type) override;
  void do_reduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                         ReduceOp op) override;
  void broadcast(void* buffer, std::size_t count, DataType type, int root) override;
  void all_to_all(const void* send, void* recv, std::size_t count, DataType type) override;
  void do_send(const void* buffer, std::size_t count, DataType type, int peer) override;
  void do_recv(void* buffer, std::size_t count, DataType type, int peer) override;
  void do_send_recv(const void* send_buffer, std::size_t send_count, int send_peer,
                    void* recv_buffer, std::size_t recv_count, int recv_peer,
                    DataType type) override;
  void barrier() override;
  void synchronize() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  // ncclCommAbort, from any thread: queued kernels stop, a synchronize() waiting on them throws.
  void abort() override;

private:
  NcclCommunicator(ncclComm_t comm, int device, std::unique_ptr<Communicator> host_group);
  // Starts one NCCL call on this communicator (start() returns its result) unless it is aborted,
  // then polls until NCCL has accepted it; the abort lock is held only around each NCCL call, so
  // abort() never waits for a call that does not return. Throws CommError.
  template <class Call> void enqueue(const char* call, Call&& start);
  void throw_if_aborted() const;

  ncclComm_t comm_;
  int device_;
  std::unique_ptr<Communicator> host_group_;
  cudaStream_t stream_ = nullptr;
  void* barrier_scratch_ = nullptr;  // one int on the device, for barrier() without a host group
  int rank_ = 0;
  int size_ = 1;
  // abort() from the watchdog's thread against synchronize()'s polling of the communicator
  // (ncclCommAbort frees it).
  std::mutex abort_mutex_;
  std::atomic<bool> aborted_{false};
};

}  // namespace shardplan::comm
