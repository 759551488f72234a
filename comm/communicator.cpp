#include "comm/communicator.hpp"

#include <fmt/format.h>

#include "comm/comm_error.hpp"

namespace shardplan::comm {

void Communicator::check_peer(int peer, const char* call) const {
  if (peer < 0 || peer >= size())
    throw CommError(
        fmt::format("{}: peer {} is not a rank of this group of {}", call, peer, size()), __FILE__,
        __LINE__);
  if (peer == rank())
    throw CommError(fmt::format("{}: peer {} is this rank itself", call, peer), __FILE__, __LINE__);
}

}  // namespace shardplan::comm
