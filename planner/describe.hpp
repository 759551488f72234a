// `planner describe`: the per-unit parameter table of a model.
#pragma once

#include <string>

#include "costmodel/model.hpp"

namespace shardplan::planner {
std::string describe_table(const costmodel::ModelSpec& m);
}
