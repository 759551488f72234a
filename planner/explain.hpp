// The explanation of a recommendation: the job's primary bottleneck, named from the numbers, and
// the reasoning an experienced engineer would give for the choice and against the alternatives.
#pragma once

#include <string>
#include <vector>

#include "planner/search.hpp"

namespace shardplan::planner {

enum class Bottleneck { memory_capacity, communication, compute };
const char* bottleneck_name(Bottleneck b);  // "memory capacity", "communication", "compute"

struct Explanation {
  Bottleneck bottleneck = Bottleneck::compute;
  std::string summary;             // one sentence with the deciding numbers
  std::vector<std::string> reasons;  // further sentences, most important first
};

Explanation explain(const Scenario& sc, const SearchResult& r);

}  // namespace shardplan::planner
