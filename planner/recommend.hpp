// `planner recommend`: the search, its explanation, and their renderings.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "planner/explain.hpp"
#include "planner/search.hpp"

namespace shardplan::planner {

struct Recommendation {
  SearchResult search;
  Explanation explanation;
};

Recommendation recommend(const Scenario& sc, const SearchPins& pins);

// `top`: how many ranked candidates to list (the JSON also lists each family's best).
std::string recommendation_table(const Scenario& sc, const Recommendation& r, int top);
nlohmann::json recommendation_json(const Scenario& sc, const Recommendation& r, int top);
std::string default_job_line(const Scenario& sc);

// The plan document of an evaluation (what `executor --plan` runs).
nlohmann::json plan_document(const Scenario& sc, const Evaluation& e);

}  // namespace shardplan::planner
