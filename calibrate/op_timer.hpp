// Timing a run of collectives on one rank: on the host clock (std::chrono::steady_clock) after
// the communicator has completed them, or with CUDA events recorded on an NCCL communicator's
// stream, so that only the GPU work between the events counts.
#pragma once

#include <memory>

#include "comm/communicator.hpp"

namespace shardplan::calibrate {

class OpTimer {
public:
  virtual ~OpTimer() = default;
  virtual void start() = 0;
  // Seconds since start(), once every collective issued since has completed.
  virtual double stop_seconds() = 0;
};

// CUDA events for an NCCL communicator, the host clock otherwise.
std::unique_ptr<OpTimer> make_op_timer(comm::Communicator& group);

}  // namespace shardplan::calibrate
