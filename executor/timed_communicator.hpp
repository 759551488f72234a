// A Communicator that forwards every call to another one and adds its wall time and bytes to a
// CollectiveStats: how the engine learns what its collectives cost without timing each call site.
// The time is the host's clock around the call; on the MPI backend the call has completed when it
// returns, so that is the collective's time (including waiting for the slowest rank).
#pragma once

#include <memory>
#include <string>

#include "comm/forwarding_communicator.hpp"
#include "executor/collective_stats.hpp"

namespace shardplan::executor {

class TimedCommunicator final : public comm::ForwardingCommunicator {
public:
  // Neither `inner` nor `stats` is owned; both must outlive this object.
  TimedCommunicator(comm::Communicator& inner, CollectiveStats& stats)
      : ForwardingCommunicator(inner), stats_(stats) {}

  void do_all_reduce(const void* send, void* recv, std::size_t count, comm::DataType type,
                     comm::ReduceOp op) override;
  void do_reduce(const void* send, void* recv, std::size_t count, comm::DataType type, int root,
                 comm::ReduceOp op) override;
  void all_gather(const void* send, void* recv, std::size_t count, comm::DataType type) override;
  void do_reduce_scatter(const void* send, void* recv, std::size_t count, comm::DataType type,
                         comm::ReduceOp op) override;
  void broadcast(void* buffer, std::size_t count, comm::DataType type, int root) override;
  void all_to_all(const void* send, void* recv, std::size_t count, comm::DataType type) override;
  void barrier() override;
  // split() is forwarded: the new group is not timed (the engine makes its groups before it
  // starts timing).

private:
  template <class F>
  void timed(CollectiveKind kind, documents::Collective op, double size_bytes, F&& call);

  CollectiveStats& stats_;
};

}  // namespace shardplan::executor
