// `planner describe`: the per-unit parameter table of a model; `planner models` and `planner
// hardware`: the presets.
#pragma once

#include <ostream>
#include <string>

#include "documents/model.hpp"

namespace shardplan::planner {
std::string describe_table(const documents::ModelSpec& m);
// One line per model preset: name, architecture, parameters.
void list_models(std::ostream& out);
// One line per hardware profile: name and description; none is an InputError naming the data dir.
void list_hardware(std::ostream& out);
}  // namespace shardplan::planner
