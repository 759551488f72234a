// Whole training steps: the simulator's allocated peak and its categories against PyTorch's own
// MemTracker / FSDPMemTracker over transformers' Llama and GPT-2 (bare model, DDP on 1 and 2
// gloo ranks, FSDP2 on 2 gloo ranks; validation/measure_steps.py:
// tests/costmodel/data/oracle_steps.json).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "oracle_corpus.hpp"

using namespace shardplan;

namespace {
bool is_fsdp2(const oracle::Row& r) { return r.case_id.rfind("fsdp2/", 0) == 0; }
}  // namespace

TEST_CASE("oracle::whole-step peaks within 3%, categories within 5%") {
  const auto rows = oracle::step_rows(oracle::read_corpus("oracle_steps.json"));
  std::map<std::string, double> peak_of;
  for (const auto& r : rows)
    if (r.quantity == "peak") peak_of[r.case_id] = r.measured;
  int peaks = 0, skipped = 0;
  double worst = 0, worst_fsdp2 = 0;
  for (const auto& r : rows) {
    if (!r.skipped.empty()) {
      skipped += r.quantity == "peak";
      continue;
    }
    INFO(r.case_id << " " << r.quantity << ": predicted " << r.predicted << ", measured "
                   << r.measured);
    if (r.quantity == "peak") {
      ++peaks;
      // FSDP2 on gloo CPU ranks: gloo's threads free collective buffers at varying moments, and
      // the same case's peak moved by up to 4.8% between runs of the harness; the bound is that
      // spread plus 2%.
      const double bound = is_fsdp2(r) ? 0.07 : 0.03;
      (is_fsdp2(r) ? worst_fsdp2 : worst) =
          std::max(is_fsdp2(r) ? worst_fsdp2 : worst, std::abs(r.error()));
      CHECK(std::abs(r.error()) < bound);
    } else if (!is_fsdp2(r)) {
      // A category: within 5% of itself, or, when it is under 2% of the peak (the batch's token
      // ids, the loss scalar), within 1% of the peak.
      const double peak = peak_of.at(r.case_id);
      const double diff = std::abs(r.predicted - r.measured);
      if (std::max(r.predicted, r.measured) >= 0.02 * peak)
        CHECK(diff <= 0.05 * r.measured);
      else
        CHECK(diff <= 0.01 * peak);
    }
  }
  MESSAGE("whole steps compared: " << peaks << " (" << skipped << " set aside), worst peak error "
                                   << 100 * worst << "% (bare and DDP), " << 100 * worst_fsdp2
                                   << "% (FSDP2)");
  CHECK(peaks >= 120);
}

TEST_CASE("oracle::deepspeed ZeRO-1/2/3 whole-step peaks within 3%") {
  // DeepSpeed 0.19.8's engines on 2 gloo ranks (validation/measure_deepspeed.py:
  // tests/costmodel/data/oracle_deepspeed.json). Its default reduce bucket (5e8 elements of the
  // gradients' dtype) is 95-97% of these small models' peaks, so the categories are reported by
  // bench/memory_corpus, not asserted here.
  int peaks = 0;
  double worst = 0;
  for (const auto& r : oracle::step_rows(oracle::read_corpus("oracle_deepspeed.json"))) {
    if (r.quantity != "peak" || !r.skipped.empty()) continue;
    ++peaks;
    worst = std::max(worst, std::abs(r.error()));
    INFO(r.case_id << ": predicted " << r.predicted << ", measured " << r.measured);
    CHECK(std::abs(r.error()) < 0.03);
  }
  MESSAGE("DeepSpeed steps compared: " << peaks << ", worst peak error " << 100 * worst << "%");
  CHECK(peaks == 24);
}
