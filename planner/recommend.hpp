// `planner recommend`: the search, its explanation, and their renderings.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "planner/explain.hpp"
#include "planner/parallel_search.hpp"
#include "planner/search.hpp"

namespace shardplan::planner {

struct Recommendation {
  SearchResult search;
  Explanation explanation;
  // The recommended plan again with the recipe's Float8 training (torchtitan's default recipe,
  // rowwise), where the job names none and the recipe and the GPU offer it, or, where no plan
  // fits, the best plan the same search finds with it: Float8 changes the training's numerics, so
  // the search does not choose it; the answer says what it would give.
  std::optional<Evaluation> with_float8;
};

Recommendation recommend(const Scenario& sc, const SearchPins& pins);

// The layout search's fastest plan again with the recipe's Float8, or, where no layout fits, the
// fastest the same layout search finds with it (as Recommendation::with_float8); nullopt where
// the job, its recipe or the GPU offer none, or nothing fits with it either.
std::optional<Evaluation> layouts_with_float8(const Scenario& sc, const LayoutSearch& found);
// The line saying what that plan gives beside the layout search's answer.
std::string layout_float8_line(const Scenario& sc, const LayoutSearch& found,
                               const Evaluation& fp8);

// `top`: how many ranked candidates to list (the JSON also lists each family's best).
std::string recommendation_table(const Scenario& sc, const Recommendation& r, int top);
nlohmann::json recommendation_json(const Scenario& sc, const Recommendation& r, int top);
std::string default_job_line(const Scenario& sc);

// The plan document of an evaluation (what `executor --plan` runs).
nlohmann::json plan_document(const Scenario& sc, const Evaluation& e);

}  // namespace shardplan::planner
