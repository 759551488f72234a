// The cost model's per-unit activation bytes against what autograd saves in the frameworks' own
// model code (transformers 5.23 Llama, Mistral, Qwen2, GPT-2, GPT-NeoX; torchtitan 0.3 Llama),
// measured on CPU with torch.autograd.graph.saved_tensors_hooks by validation/measure_units.py:
// tests/costmodel/data/oracle_units.json. The formulas are derived per tensor from the model code
// (costmodel/block_table.cpp), not fitted to these numbers.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "oracle_corpus.hpp"

using namespace shardplan;

TEST_CASE("oracle::every unit's saved bytes within 1% of autograd's") {
  const auto rows = oracle::unit_rows(oracle::read_corpus("oracle_units.json"));
  int compared = 0;
  std::set<std::string> recipes, skipped_reasons;
  double worst = 0;
  for (const auto& r : rows) {
    if (!r.skipped.empty()) {
      skipped_reasons.insert(r.skipped);
      continue;
    }
    ++compared;
    recipes.insert(r.recipe);
    worst = std::max(worst, std::abs(r.error()));
    INFO(r.case_id << " " << r.quantity << ": predicted " << r.predicted << ", measured "
                   << r.measured);
    CHECK(std::abs(r.error()) < 0.01);
  }
  MESSAGE("units compared: " << compared << ", worst error " << 100 * worst << "%");
  // The corpus covers both recipes and most of its cases; only the CPU-only dropout and math-path
  // cases are set aside, each with its reason.
  CHECK(compared > 1000);
  CHECK(recipes == std::set<std::string>{"hf", "torchtitan"});
  CHECK(skipped_reasons.size() <= 2);
}
