// MPI for the life of one object: initialized (MPI_THREAD_FUNNELED: only the main thread calls MPI)
// unless something else already did, and finalized by whoever initialized it. Communicators must
// be destroyed before it.
#pragma once

#include <memory>

#include "comm/mpi_communicator.hpp"

namespace shardplan::comm {

class MpiEnvironment {
public:
  MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;
  ~MpiEnvironment();

  // A private duplicate of MPI_COMM_WORLD whose errors come back as CommError.
  std::unique_ptr<MpiCommunicator> world() const;
  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  // Whether threads other than the main one may call MPI at once (MPI_THREAD_MULTIPLE was
  // provided): what collective streams need.
  bool threads_may_call() const { return thread_level_ >= MPI_THREAD_MULTIPLE; }
  // Ends every rank of the job (MPI_Abort): for a program whose ranks can no longer agree.
  [[noreturn]] void abort(int exit_code) const;

private:
  bool initialized_here_ = false;
  int world_rank_ = 0;
  int world_size_ = 1;
  int thread_level_ = MPI_THREAD_SINGLE;
};

}  // namespace shardplan::comm
