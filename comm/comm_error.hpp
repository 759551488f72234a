// The one exception type for failures of the communication runtime (MPI, NCCL, CUDA): its message
// names what failed and why, and where: host, world rank, source file and line.
#pragma once

#include <stdexcept>
#include <string>

namespace shardplan::comm {

class CommError : public std::runtime_error {
public:
  // what_failed: the call and the library's own error text ("MPI_Allreduce: MPI_ERR_COUNT: ...").
  // The host and rank come from process_identity.hpp.
  CommError(const std::string& what_failed, const char* file, int line);
  const std::string& host() const { return host_; }
  int rank() const { return rank_; }
  const std::string& file() const { return file_; }
  int line() const { return line_; }

private:
  CommError(const std::string& what_failed, std::string host, int rank, std::string file, int line);
  std::string host_;
  int rank_;
  std::string file_;  // the last two components of the source path ("comm/mpi_communicator.cpp")
  int line_;
};

}  // namespace shardplan::comm
