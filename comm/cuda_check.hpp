// Checking every CUDA runtime call: a failure becomes a CommError with the call's name, CUDA's
// error text, and the host, rank, file and line.
#pragma once

#include <cuda_runtime.h>

namespace shardplan::comm {

void check_cuda(cudaError_t code, const char* call, const char* file, int line);
#define SHARDPLAN_CUDA_CALL(function, ...)                                                         \
  ::shardplan::comm::check_cuda(function(__VA_ARGS__), #function, __FILE__, __LINE__)

}  // namespace shardplan::comm
