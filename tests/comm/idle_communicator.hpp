// A group of one in host memory whose collectives do nothing: the base of the tests' stand-in
// communicators, each of which overrides only what it observes.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "comm/host_buffer.hpp"

namespace shardplan::comm::test {

class IdleCommunicator : public Communicator {
public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "test"; }
  std::string library_version() const override { return "none"; }
  MemorySpace memory_space() const override { return MemorySpace::host; }
  std::unique_ptr<CommBuffer> allocate(std::size_t bytes) override {
    return std::make_unique<HostBuffer>(bytes);
  }
  void all_gather(const void*, void*, std::size_t, DataType) override {}
  void broadcast(void*, std::size_t, DataType, int) override {}
  void all_to_all(const void*, void*, std::size_t, DataType) override {}
  void barrier() override {}
  void synchronize() override {}
  std::unique_ptr<Communicator> split(int, int) override { return nullptr; }

protected:
  void do_all_reduce(const void*, void*, std::size_t, DataType, ReduceOp) override {}
  void do_reduce(const void*, void*, std::size_t, DataType, int, ReduceOp) override {}
  void do_reduce_scatter(const void*, void*, std::size_t, DataType, ReduceOp) override {}
  void do_send(const void*, std::size_t, DataType, int) override {}
  void do_recv(void*, std::size_t, DataType, int) override {}
  void do_send_recv(const void*, std::size_t, int, void*, std::size_t, int, DataType) override {}
};

}  // namespace shardplan::comm::test
