// The cost model against the frameworks' measured memory: one line per compared quantity (case,
// recipe, quantity, predicted, measured, error), then the median and largest error per quantity.
// A category's error is told as a fraction of its case's peak (the token ids at the optimizer
// step are a few bytes: their own relative error says nothing).
//   build/release/bench/memory_corpus [--summary]
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "oracle_corpus.hpp"

using namespace shardplan;

int main(int argc, char** argv) {
  const bool summary_only = argc > 1 && std::strcmp(argv[1], "--summary") == 0;
  std::map<std::string, std::vector<double>> errors;  // |error| per quantity kind
  std::map<std::string, int> set_aside;
  auto report = [&](const char* corpus, const std::vector<oracle::Row>& rows) {
    std::map<std::string, double> peak_of;
    for (const auto& r : rows)
      if (r.quantity == "peak") peak_of[r.case_id] = r.measured;
    if (!summary_only)
      fmt::print("{:<64} {:<10} {:<28} {:>14} {:>14} {:>8}\n", corpus, "recipe", "quantity",
                 "predicted B", "measured B", "error");
    for (const auto& r : rows) {
      std::string kind = r.quantity.rfind("block", 0) == 0 ? "unit: block" : r.quantity;
      if (kind == "embedding" || kind == "head" || kind == "total") kind.insert(0, "unit: ");
      const bool category = kind.rfind("peak/", 0) == 0;
      if (peak_of.count(r.case_id))
        kind.insert(0, r.case_id.rfind("fsdp2/", 0) == 0       ? "fsdp2 "
                       : r.case_id.rfind("deepspeed-", 0) == 0 ? "deepspeed "
                                                               : "bare/ddp ");
      if (!r.skipped.empty()) {
        ++set_aside[kind];
        continue;
      }
      errors[kind].push_back(category ? std::abs(r.predicted - r.measured) / peak_of.at(r.case_id)
                                      : std::abs(r.error()));
      if (!summary_only)
        fmt::print("{:<64} {:<10} {:<28} {:>14.0f} {:>14.0f} {:>7.2f}%\n", r.case_id, r.recipe,
                   r.quantity, r.predicted, r.measured, 100 * r.error());
    }
  };
  report("oracle_units.json case", oracle::unit_rows(oracle::read_corpus("oracle_units.json")));
  report("oracle_steps.json case", oracle::step_rows(oracle::read_corpus("oracle_steps.json")));
  report("oracle_deepspeed.json case",
         oracle::step_rows(oracle::read_corpus("oracle_deepspeed.json")));
  fmt::print("\n{:<28} {:>8} {:>10} {:>12} {:>12}\n", "quantity", "compared", "set aside",
             "median |err|", "max |err|");
  for (auto& [kind, e] : errors) {
    std::sort(e.begin(), e.end());
    fmt::print("{:<28} {:>8} {:>10} {:>11.3f}% {:>11.3f}%\n", kind, e.size(), set_aside[kind],
               100 * e[e.size() / 2], 100 * e.back());
  }
  return 0;
}
