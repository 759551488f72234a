// `planner describe`: the per-unit parameter table of a model.
#pragma once

#include <string>

#include "documents/model.hpp"

namespace shardplan::planner {
std::string describe_table(const documents::ModelSpec& m);
}
