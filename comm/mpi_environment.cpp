#include "comm/mpi_environment.hpp"

#include <cstdlib>

#include <fmt/format.h>

#include "comm/comm_error.hpp"
#include "comm/process_identity.hpp"

namespace shardplan::comm {

MpiEnvironment::MpiEnvironment() {
  int initialized = 0;
  SHARDPLAN_MPI_CALL(MPI_Initialized, &initialized);
  if (!initialized) {
    // MPI_THREAD_MULTIPLE: collective streams (comm/host_stream.hpp) call MPI from their own
    // threads, each on its own communicator.
    SHARDPLAN_MPI_CALL(MPI_Init_thread, nullptr, nullptr, MPI_THREAD_MULTIPLE, &thread_level_);
    initialized_here_ = true;
  } else {
    SHARDPLAN_MPI_CALL(MPI_Query_thread, &thread_level_);
  }
  // Errors on the world (and on communicators made from it) come back as return codes.
  SHARDPLAN_MPI_CALL(MPI_Comm_set_errhandler, MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  SHARDPLAN_MPI_CALL(MPI_Comm_rank, MPI_COMM_WORLD, &world_rank_);
  SHARDPLAN_MPI_CALL(MPI_Comm_size, MPI_COMM_WORLD, &world_size_);
  set_process_rank(world_rank_);
}

MpiEnvironment::~MpiEnvironment() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (initialized_here_ && !finalized) MPI_Finalize();
}

std::unique_ptr<MpiCommunicator> MpiEnvironment::world() const {
  MPI_Comm copy = MPI_COMM_NULL;
  SHARDPLAN_MPI_CALL(MPI_Comm_dup, MPI_COMM_WORLD, &copy);
  return std::make_unique<MpiCommunicator>(copy);
}

void MpiEnvironment::abort(int exit_code) const {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] true if it ever did
}

}  // namespace shardplan::comm
