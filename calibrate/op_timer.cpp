#include "calibrate/op_timer.hpp"

#include <chrono>

#if defined(SHARDPLAN_HAVE_NCCL)
#include "calibrate/cuda_event_timer.hpp"
#include "comm/nccl_communicator.hpp"
#endif

namespace shardplan::calibrate {
namespace {

class HostClockTimer final : public OpTimer {
public:
  explicit HostClockTimer(comm::Communicator& group) : group_(group) {}
  void start() override { begin_ = std::chrono::steady_clock::now(); }
  double stop_seconds() override {
    group_.synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin_).count();
  }

private:
  comm::Communicator& group_;
  std::chrono::steady_clock::time_point begin_;
};

}  // namespace

std::unique_ptr<OpTimer> make_op_timer(comm::Communicator& group) {
#if defined(SHARDPLAN_HAVE_NCCL)
  if (auto* nccl = dynamic_cast<comm::NcclCommunicator*>(&group))
    return make_cuda_event_timer(nccl->stream());
#endif
  return std::make_unique<HostClockTimer>(group);
}

}  // namespace shardplan::calibrate
