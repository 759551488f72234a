// A Communicator that forwards every call to another one and adds its wall time and bytes to a
// CollectiveStats: how the engine learns what its collectives cost without timing each call site.
// The time is the host's clock around the call; on the MPI backend the call has completed when it
// returns, so that is the collective's time (including waiting for the slowest rank).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.hpp"
#include "executor/collective_stats.hpp"

namespace shardplan::executor {

class TimedCommunicator final : public comm::Communicator {
public:
  // Neither `inner` nor `stats` is owned; both must outlive this object.
  TimedCommunicator(comm::Communicator& inner, CollectiveStats& stats)
      : inner_(inner), stats_(stats) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* backend() const override { return inner_.backend(); }
  std::string library_version() const override { return inner_.library_version(); }
  comm::MemorySpace memory_space() const override { return inner_.memory_space(); }
  void* stream_handle() const override { return inner_.stream_handle(); }
  comm::HostStream* host_stream() override { return inner_.host_stream(); }
  std::unique_ptr<comm::CommBuffer> allocate(std::size_t bytes) override {
    return inner_.allocate(bytes);
  }

  void all_reduce(const void* send, void* recv, std::size_t count, comm::DataType type,
                  comm::ReduceOp op = comm::ReduceOp::sum) override;
  void reduce(const void* send, void* recv, std::size_t count, comm::DataType type, int root,
              comm::ReduceOp op = comm::ReduceOp::sum) override;
  void all_gather(const void* send, void* recv, std::size_t count, comm::DataType type) override;
  void reduce_scatter(const void* send, void* recv, std::size_t count, comm::DataType type,
                      comm::ReduceOp op = comm::ReduceOp::sum) override;
  void broadcast(void* buffer, std::size_t count, comm::DataType type, int root) override;
  void all_to_all(const void* send, void* recv, std::size_t count, comm::DataType type) override;
  void barrier() override;
  void synchronize() override { inner_.synchronize(); }
  // The new group is not timed (the engine makes its groups before it starts timing).
  std::unique_ptr<comm::Communicator> split(int color, int key) override {
    return inner_.split(color, key);
  }
  void abort() override { inner_.abort(); }

private:
  template <class F>
  void timed(CollectiveKind kind, costmodel::Collective op, double size_bytes, F&& call);

  comm::Communicator& inner_;
  CollectiveStats& stats_;
};

} // namespace shardplan::executor
