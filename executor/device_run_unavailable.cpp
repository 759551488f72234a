// open_device in a build without the CUDA toolkit (device_run.hpp).
#include "executor/device_run.hpp"

#include "core/input_error.hpp"

namespace shardplan::executor {

std::unique_ptr<DeviceRun> open_device(int, std::int64_t) {
  throw core::InputError("--backend",
                         "cuda: this build has no CUDA backend (the CUDA toolkit was not "
                         "found when it was configured)");
}

}  // namespace shardplan::executor
