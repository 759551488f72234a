// `--svg FILE`: the memory breakdown at the peak of the best plan of each strategy family, one
// stacked bar each, against the GPU's capacity and the usable capacity (capacity minus headroom).
// A self-contained SVG document (no scripts, no external styles), every text XML-escaped.
#pragma once

#include <string>
#include <vector>

#include "planner/estimate.hpp"
#include "planner/scenario.hpp"

namespace shardplan::planner {

// Bars in the order given; a plan that does not fit gets a red dashed outline and "does not
// fit", a plan that is not runnable an empty slot saying so. Axis in GiB.
std::string memory_svg(const Scenario& sc, const std::vector<Evaluation>& best_per_family);

// The text with &, <, >, " and ' replaced by their XML entities.
std::string xml_escape(const std::string& text);

}  // namespace shardplan::planner
