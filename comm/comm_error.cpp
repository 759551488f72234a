#include "comm/comm_error.hpp"

#include <fmt/format.h>

#include "comm/process_identity.hpp"

namespace shardplan::comm {
namespace {

// "…/comm/mpi_communicator.cpp" -> "comm/mpi_communicator.cpp": enough to find the line, and no
// build machine's folders in the message.
std::string short_source_path(const char* file) {
  std::string path(file);  // not const, so that "return path" moves it
  const auto last = path.find_last_of('/');
  if (last == std::string::npos || last == 0) return path;
  const auto before = path.find_last_of('/', last - 1);
  return before == std::string::npos ? path : path.substr(before + 1);
}

std::string rank_text(int rank) { return rank < 0 ? std::string("?") : std::to_string(rank); }

}  // namespace

CommError::CommError(const std::string& what_failed, const char* file, int line)
    : CommError(what_failed, host_name(), process_rank(), short_source_path(file), line) {}

CommError::CommError(const std::string& what_failed, std::string host, int rank, std::string file,
                     int line)
    : std::runtime_error(fmt::format("{} (host {}, rank {}, {}:{})", what_failed, host,
                                     rank_text(rank), file, line)),
      host_(std::move(host)), rank_(rank), file_(std::move(file)), line_(line) {}

}  // namespace shardplan::comm
