#include "calibrate/cuda_event_timer.hpp"

#include "comm/cuda_check.hpp"

namespace shardplan::calibrate {
namespace {

class CudaEventTimer final : public OpTimer {
public:
  explicit CudaEventTimer(cudaStream_t stream) : stream_(stream) {
    SHARDPLAN_CUDA_CALL(cudaEventCreate, &begin_);
    SHARDPLAN_CUDA_CALL(cudaEventCreate, &end_);
  }
  ~CudaEventTimer() override {
    (void)cudaEventDestroy(begin_);
    (void)cudaEventDestroy(end_);
  }
  CudaEventTimer(const CudaEventTimer&) = delete;
  CudaEventTimer& operator=(const CudaEventTimer&) = delete;

  void start() override { SHARDPLAN_CUDA_CALL(cudaEventRecord, begin_, stream_); }
  double stop_seconds() override {
    SHARDPLAN_CUDA_CALL(cudaEventRecord, end_, stream_);
    SHARDPLAN_CUDA_CALL(cudaEventSynchronize, end_);
    float milliseconds = 0;
    SHARDPLAN_CUDA_CALL(cudaEventElapsedTime, &milliseconds, begin_, end_);
    return static_cast<double>(milliseconds) * 1e-3;
  }

private:
  cudaStream_t stream_;
  cudaEvent_t begin_ = nullptr;
  cudaEvent_t end_ = nullptr;
};

}  // namespace

std::unique_ptr<OpTimer> make_cuda_event_timer(cudaStream_t stream) {
  return std::make_unique<CudaEventTimer>(stream);
}

}  // namespace shardplan::calibrate
