// The cost model's per-unit activation bytes of transformers' mixtures of experts (Mixtral,
// Qwen2-MoE with its shared expert, Qwen3-MoE and OLMoE with their q/k norms) against what
// autograd saves in transformers 5.23's own code on its default experts path (grouped_mm),
// measured on CPU with torch.autograd.graph.saved_tensors_hooks by validation/measure_moe_units.py:
// tests/costmodel/data/oracle_moe_units.json. The rows are derived per tensor from the model code
// (costmodel/block_table.cpp, moe_rows), not fitted to these numbers.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "oracle_corpus.hpp"

using namespace shardplan;

TEST_CASE("oracle_moe::every unit's saved bytes within 1% of autograd's on the default experts "
          "path") {
  nlohmann::json corpus = oracle::read_corpus("oracle_moe_units.json");
  // The default path only: the Python loop over experts ("eager") and batched_mm keep other
  // tensors (per-expert slices, each pair's gathered weights), not modeled.
  auto& cases = corpus.at("cases");
  cases.erase(std::remove_if(cases.begin(), cases.end(),
                             [](const nlohmann::json& c) {
                               return c.at("experts_implementation") != "grouped_mm";
                             }),
              cases.end());
  const auto rows = oracle::unit_rows(corpus);
  int compared = 0;
  std::set<std::string> models;
  double worst = 0;
  for (const auto& r : rows) {
    REQUIRE(r.skipped.empty());
    ++compared;
    models.insert(r.case_id.substr(3, r.case_id.find('/', 3) - 3));
    worst = std::max(worst, std::abs(r.error()));
    INFO(r.case_id << " " << r.quantity << ": predicted " << r.predicted << ", measured "
                   << r.measured);
    CHECK(std::abs(r.error()) < 0.01);
  }
  MESSAGE("MoE units compared: " << compared << ", worst error " << 100 * worst << "%");
  // 4 models x 2 precisions x 2 attentions x 2 checkpointings x 4 shapes, 5 rows each
  // (embedding, 2 blocks, head, total).
  CHECK(compared == 128 * 5);
  CHECK(models.size() == 4);
}
