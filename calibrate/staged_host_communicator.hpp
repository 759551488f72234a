// Host-memory collectives carried by a communicator whose buffers live elsewhere (NCCL's, on the
// rank's GPU): each call copies the host data into staging buffers of the inner communicator
// (Communicator::allocate), runs the same collective there, waits for it, and copies the result
// back. What calibrate exchanges between ranks on the host (host names for the topology, rank 0's
// preflight verdict, barriers, the slowest rank's times) is a few kilobytes, so the copies cost
// nothing next to the measurements; this is how ranks started without MPI (torchrun) exchange them.
// The calls keep the host communicator's contract (comm/communicator.hpp): complete when they
// return, in place where the interface allows it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "comm/forwarding_communicator.hpp"

namespace shardplan::calibrate {

class StagedHostCommunicator final : public comm::ForwardingCommunicator {
public:
  // `inner` is not owned and must outlive this object.
  explicit StagedHostCommunicator(comm::Communicator& inner);
  // Owns `inner` (a group split off another staged communicator).
  explicit StagedHostCommunicator(std::unique_ptr<comm::Communicator> inner);

  comm::MemorySpace memory_space() const override { return comm::MemorySpace::host; }
  // Every call has completed when it returns: no stream to order against.
  void* stream_handle() const override { return nullptr; }
  // Host memory (comm::HostBuffer).
  std::unique_ptr<comm::CommBuffer> allocate(std::size_t bytes) override;

  void do_all_reduce(const void* send, void* recv, std::size_t count, comm::DataType type,
                     comm::ReduceOp op) override;
  void do_reduce(const void* send, void* recv, std::size_t count, comm::DataType type, int root,
                 comm::ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::size_t count, comm::DataType type) override;
  void do_reduce_scatter(const void* send, void* recv, std::size_t count, comm::DataType type,
                         comm::ReduceOp op) override;
  void broadcast(void* buffer, std::size_t count, comm::DataType type, int root) override;
  void all_to_all(const void* send, void* recv, std::size_t count, comm::DataType type) override;
  // Every call has completed when it returns.
  void do_send(const void* buffer, std::size_t count, comm::DataType type, int peer) override;
  void do_recv(void* buffer, std::size_t count, comm::DataType type, int peer) override;
  void do_send_recv(const void* send_buffer, std::size_t send_count, int send_peer,
                    void* recv_buffer, std::size_t recv_count, int recv_peer,
                    comm::DataType type) override;
  void synchronize() override {}
  std::unique_ptr<comm::Communicator> split(int color, int key) override;

private:
  // The staging buffers, grown to at least `bytes` (their contents are not kept).
  comm::CommBuffer& send_stage(std::size_t bytes);
  comm::CommBuffer& recv_stage(std::size_t bytes);

  std::unique_ptr<comm::Communicator> owned_;
  std::unique_ptr<comm::CommBuffer> send_;
  std::unique_ptr<comm::CommBuffer> recv_;
};

}  // namespace shardplan::calibrate
