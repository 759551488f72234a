#include "comm/cuda_check.hpp"

#include <fmt/format.h>

#include "comm/comm_error.hpp"

namespace shardplan::comm {

void check_cuda(cudaError_t code, const char* call, const char* file, int line) {
  if (code == cudaSuccess) return;
  throw CommError(
      fmt::format("{} failed: {}: {}", call, cudaGetErrorName(code), cudaGetErrorString(code)),
      file, line);
}

}  // namespace shardplan::comm
