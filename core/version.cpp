#include "core/version.hpp"

namespace shardplan::core {

const char* version() { return SHARDPLAN_VERSION; }

std::string generator() { return std::string("shardplan ") + SHARDPLAN_VERSION; }

}  // namespace shardplan::core
