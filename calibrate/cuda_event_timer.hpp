// An OpTimer from two CUDA events recorded on a stream (built with CUDA only).
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "calibrate/op_timer.hpp"

namespace shardplan::calibrate {

std::unique_ptr<OpTimer> make_cuda_event_timer(cudaStream_t stream);

}  // namespace shardplan::calibrate
