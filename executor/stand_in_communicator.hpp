// The communicator of a rehearsal: one process plays rank `rank` of a group of `size` ranks and
// stands in for each collective with a local copy of the same size, so the rank allocates and
// touches exactly the buffers it would in the real N-rank run (its memory is the real footprint)
// while nothing is sent. The values are not the real run's: an all-gather fills every rank's block
// with this rank's block, a reduce-scatter keeps this rank's block of the input (the sum over N
// identical ranks would only scale it), an all-reduce keeps the input. The time of a collective is
// that of the copy, not of the network: a rehearsal's run document says collective time is
// excluded. The copies are in the memory the rank's buffers live in (a GPU's for the CUDA backend,
// queued on its current stream, in order with the compute).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "kernels/memory_source.hpp"

namespace shardplan::executor {

class StandInCommunicator final : public comm::Communicator {
public:
  // Throws std::invalid_argument unless 0 <= rank < size. memory: where the buffers it copies
  // live (not owned; nullptr: the host's heap).
  StandInCommunicator(int rank, int size, kernels::MemorySource* memory = nullptr);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "rehearsal"; }
  std::string library_version() const override { return "local copies in place of collectives"; }
  comm::MemorySpace memory_space() const override {
    return memory_->host_accessible() ? comm::MemorySpace::host : comm::MemorySpace::device;
  }
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
  // Nothing travels: a send reads nothing, a receive leaves its buffer as it is (the buffer was
  // allocated by the caller, so the rank's footprint is the real run's).
  void do_send(const void*, std::size_t, comm::DataType, int) override {}
  void do_recv(void*, std::size_t, comm::DataType, int) override {}
  void do_send_recv(const void*, std::size_t, int, void*, std::size_t, int,
                    comm::DataType) override {}
  void barrier() override {}
  void synchronize() override {}
  // A group of one: with one process the other members are unknown, so a rehearsal builds its
  // shard and replica groups with the constructor (rank and size within each group) instead.
  std::unique_ptr<comm::Communicator> split(int color, int key) override;

private:
  void copy(const void* send, void* recv, std::size_t bytes);

  int rank_;
  int size_;
  kernels::HostMemory heap_;
  kernels::MemorySource* memory_;
};

}  // namespace shardplan::executor
