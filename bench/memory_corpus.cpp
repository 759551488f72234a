// The cost model against the frameworks' measured memory: one line per compared quantity (case,
// recipe, quantity, predicted, measured, error), then the median and largest error per quantity.
// A category's error is told as a fraction of its case's peak (the token ids at the optimizer
// step are a few bytes: their own relative error says nothing). Whole steps are predicted by
// `planner estimate` with each case's flags (tests/planner/oracle_step_rows.cpp).
//   build/release/bench/memory_corpus [--summary] [CORPUS.json ...]
// Without files: the corpora checked in under tests/costmodel/data/. A file is read by what its
// generated_by says measured it (validation/measure_units.py, measure_steps.py,
// measure_deepspeed.py, measure_traffic.py), so a corpus measured anew compares the same way.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "oracle_corpus.hpp"
#include "oracle_step_rows.hpp"

using namespace shardplan;

namespace {

// The rows of a corpus, by the harness that wrote it.
std::vector<oracle::Row> rows_of(const nlohmann::json& corpus, const std::string& name) {
  const std::string by = corpus.value("generated_by", std::string());
  if (by.find("measure_units") != std::string::npos) return oracle::unit_rows(corpus);
  if (by.find("measure_traffic") != std::string::npos) return oracle::traffic_rows(corpus);
  if (by.find("measure_steps") != std::string::npos ||
      by.find("measure_fsdp1_steps") != std::string::npos ||
      by.find("measure_deepspeed") != std::string::npos)
    return oracle::step_rows(corpus);
  throw std::runtime_error(name + ": /generated_by names no harness this compares (\"" + by +
                           "\")");
}

}  // namespace

int main(int argc, char** argv) try {
  bool summary_only = false;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--summary") == 0)
      summary_only = true;
    else
      files.emplace_back(argv[i]);
  }
  std::map<std::string, std::vector<double>> errors;  // |error| per quantity kind
  std::map<std::string, int> set_aside;
  auto report = [&](const std::string& corpus, const std::vector<oracle::Row>& rows) {
    std::map<std::string, double> peak_of;
    for (const auto& r : rows)
      if (r.quantity == "peak") peak_of[r.case_id] = r.measured;
    if (!summary_only)
      fmt::print("{:<64} {:<10} {:<28} {:>14} {:>14} {:>8}\n", corpus + " case", "recipe",
                 "quantity", "predicted B", "measured B", "error");
    for (const auto& r : rows) {
      std::string kind = r.quantity.rfind("block", 0) == 0 ? "unit: block" : r.quantity;
      if (kind == "embedding" || kind == "head" || kind == "total") kind.insert(0, "unit: ");
      const bool category = kind.rfind("peak/", 0) == 0;
      if (peak_of.count(r.case_id))
        kind.insert(0, r.case_id.rfind("fsdp2/", 0) == 0       ? "fsdp2 "
                       : r.case_id.rfind("fsdp1/", 0) == 0     ? "fsdp1 "
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
  if (files.empty()) {
    for (const char* name : {"oracle_units.json", "oracle_steps.json", "oracle_fsdp1_steps.json",
                             "oracle_accelerate_steps.json", "oracle_deepspeed.json"})
      report(name, rows_of(oracle::read_corpus(name), name));
  } else {
    for (const auto& f : files) report(f, rows_of(oracle::read_corpus_file(f), f));
  }
  fmt::print("\n{:<28} {:>8} {:>10} {:>12} {:>12}\n", "quantity", "compared", "set aside",
             "median |err|", "max |err|");
  for (auto& [kind, e] : errors) {
    std::sort(e.begin(), e.end());
    fmt::print("{:<28} {:>8} {:>10} {:>11.3f}% {:>11.3f}%\n", kind, e.size(), set_aside[kind],
               100 * e[e.size() / 2], 100 * e.back());
  }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "memory_corpus: {}\n", e.what());
  return 2;
}
