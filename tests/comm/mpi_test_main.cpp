// doctest under mpirun (the comm, calibrate and executor MPI tests): every rank runs every case
// (collectives need all of them); rank 0 reports in full, the others only their failures. The
// exit code is 1 when any rank failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <memory>

#include "comm/mpi_environment.hpp"
#include "mpi_test_world.hpp"

namespace {
std::unique_ptr<shardplan::comm::MpiCommunicator> world;
}  // namespace

shardplan::comm::MpiCommunicator& test_world() { return *world; }

int main(int argc, char** argv) {
  shardplan::comm::MpiEnvironment mpi;
  world = mpi.world();
  doctest::Context context(argc, argv);
  if (mpi.world_rank() != 0) context.setOption("minimal", true);
  const int failed_here = context.run() != 0 ? 1 : 0;
  int failed_anywhere = 0;
  world->all_reduce(&failed_here, &failed_anywhere, 1, shardplan::comm::DataType::i32,
                    shardplan::comm::ReduceOp::max);
  world.reset();
  return failed_anywhere;
}
