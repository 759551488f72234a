// The MPI backend: collectives on host buffers over an MPI communicator (MPI_Allreduce,
// MPI_Reduce, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Bcast, MPI_Alltoall). Errors are
// returned, not fatal (MPI_ERRORS_RETURN), and every return code is checked. bf16 and f16 are
// reduced by this backend's own MPI operators (MPI has no 16-bit float types).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/communicator.hpp"

namespace shardplan::comm {

// Throws CommError naming `call` and MPI's error text when `code` is not MPI_SUCCESS.
void check_mpi(int code, const char* call, const char* file, int line);
#define SHARDPLAN_MPI_CALL(function, ...)                                                          \
  ::shardplan::comm::check_mpi(function(__VA_ARGS__), #function, __FILE__, __LINE__)

class MpiCommunicator final : public Communicator {
public:
  // Takes `comm` over (it is freed on destruction) and makes its errors return.
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;

  MPI_Comm native() const { return comm_; }
  // split() with the concrete type, for code that needs MPI (a bootstrap, the host side of NCCL).
  std::unique_ptr<MpiCommunicator> split_mpi(int color, int key);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }
  std::string library_version() const override;
  MemorySpace memory_space() const override { return MemorySpace::host; }
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
  void synchronize() override {}
  std::unique_ptr<Communicator> split(int color, int key) override;

private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace shardplan::comm
