// The main of the CUDA backend's doctest binaries (label gpu): on a machine without a CUDA device
// it prints "no CUDA device: skipped" and exits 77, which ctest counts as a skipped test
// (SKIP_RETURN_CODE); otherwise it runs every case on device 0.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include <cuda_runtime_api.h>

int main(int argc, char** argv) {
  constexpr int kSkipped = 77;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();  // clear the "no driver" error
    std::puts("no CUDA device: skipped");
    return kSkipped;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
