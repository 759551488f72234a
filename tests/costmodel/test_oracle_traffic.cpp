// The memory-bound bytes of costmodel/traffic.hpp against the ATen ops PyTorch dispatches for the
// frameworks' own model code (tests/costmodel/data/oracle_traffic.json, measured by
// validation/measure_traffic.py with torch, transformers and torchtitan; versions in the file).
#include <algorithm>
#include <cmath>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "oracle_corpus.hpp"

using namespace shardplan;

TEST_CASE(
    "oracle_traffic::every unit's memory-bound bytes and kernels are the frameworks' within 8%") {
  const auto rows = oracle::traffic_rows(oracle::read_corpus("oracle_traffic.json"));
  REQUIRE(rows.size() >= 600);
  int compared = 0;
  double worst = 0;
  for (const auto& r : rows) {
    if (!r.skipped.empty()) continue;
    INFO(fmt::format("{} {}: predicted {:.0f} B, measured {:.0f} B ({:+.1f}%)", r.case_id,
                     r.quantity, r.predicted, r.measured, 100 * r.error()));
    CHECK(std::abs(r.error()) <= 0.08);
    ++compared;
    worst = std::max(worst, std::abs(r.error()));
  }
  MESSAGE(fmt::format("{} rows, largest error {:.1f}%", compared, 100 * worst));
  CHECK(compared >= 600);
}
