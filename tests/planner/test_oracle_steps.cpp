// Whole training steps: `planner estimate`, run as the command line runs it (oracle_step_rows.hpp),
// against PyTorch's own MemTracker / FSDPMemTracker over transformers' Llama and GPT-2 (bare model,
// DDP on 1 and 2 gloo ranks, FSDP2 on 2 gloo ranks; validation/measure_steps.py:
// tests/costmodel/data/oracle_steps.json and, --grid stress, oracle_steps_stress.json) and
// DeepSpeed's engines (validation/measure_deepspeed.py: oracle_deepspeed.json and, --buckets
// hf-auto, oracle_deepspeed_hf_auto.json).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "oracle_step_rows.hpp"

using namespace shardplan;

namespace {

bool is_fsdp2(const oracle::Row& r) { return r.case_id.rfind("fsdp2/", 0) == 0; }

// FSDP2 cases the walk misses by more than 3% with no run-to-run spread: model errors, counted
// as misses until reconciled, never hidden by a wider bound. Each peaks at a reduce-scatter (the
// root group's at the end of the backward, or a checkpointed block's) where the tracker sees
// temporaries of 6 bytes per element of the group beside the reduce-scatter input (12,584,448 B
// for the root's 2,097,408 elements of llama-h256), which would fit a copy of the input in the
// fp32 reduce dtype plus the output shard, as gloo's reduce_scatter_tensor may make on CPU; not
// traced to the code yet, so neither modelled nor set aside.
const std::set<std::string> kKnownFsdp2Misses = {
    "fsdp2/llama-h256/fp32/full/s128-b1/w2",       "fsdp2/llama-h256/fp32/full/s128-b2/w2",
    "fsdp2/llama-h256/fp32/full/s256-b1/w2",       "fsdp2/llama-h256/bf16-mixed/none/s128-b1/w2",
    "fsdp2/llama-h256/bf16-mixed/full/s128-b1/w2", "fsdp2/llama-h256/bf16-mixed/full/s128-b2/w2",
    "fsdp2/llama-h256/bf16-mixed/full/s256-b1/w2", "fsdp2/gpt2-h256/fp32/full/s128-b2/w2",
    "fsdp2/gpt2-h256/fp32/full/s256-b1/w2",        "fsdp2/gpt2-h256/fp32/full/s256-b2/w2",
    "fsdp2/gpt2-h256/bf16-mixed/full/s128-b1/w2"};

struct Compared {
  int peaks = 0, skipped = 0, misses = 0;
  double worst = 0, worst_fsdp2 = 0, worst_miss = 0;
};

// Peaks within 3% of what was measured (of the nearest end of the range where the case was
// measured on several ranks or more than once); the known misses above still miss, and are
// counted. Bare, DDP and DeepSpeed categories within 5% of themselves, or, when under 2% of the
// peak (the batch's token ids, the loss scalar), within 1% of the peak.
Compared compare_steps(const std::vector<oracle::Row>& rows) {
  std::map<std::string, double> peak_of;
  for (const auto& r : rows)
    if (r.quantity == "peak") peak_of[r.case_id] = r.measured;
  Compared c;
  for (const auto& r : rows) {
    if (!r.skipped.empty()) {
      c.skipped += r.quantity == "peak";
      continue;
    }
    INFO(r.case_id << " " << r.quantity << ": predicted " << r.predicted << ", measured "
                   << r.measured);
    if (r.quantity == "peak") {
      ++c.peaks;
      INFO("measured over ranks and repeats: " << r.measured_low << " .. " << r.measured_high);
      const double error = std::abs(r.range_error());
      if (kKnownFsdp2Misses.count(r.case_id)) {
        ++c.misses;
        c.worst_miss = std::max(c.worst_miss, error);
        CHECK(error >= 0.03);  // reconciled: take it off the list
        continue;
      }
      double& worst = is_fsdp2(r) ? c.worst_fsdp2 : c.worst;
      worst = std::max(worst, error);
      CHECK(error < 0.03);
    } else if (!is_fsdp2(r)) {
      const double peak = peak_of.at(r.case_id);
      const double diff = std::abs(r.predicted - r.measured);
      if (std::max(r.predicted, r.measured) >= 0.02 * peak)
        CHECK(diff <= 0.05 * r.measured);
      else
        CHECK(diff <= 0.01 * peak);
    }
  }
  return c;
}

}  // namespace

TEST_CASE("oracle::whole-step peaks within 3%, categories within 5%") {
  // FSDP2 on gloo CPU ranks: gloo's threads free collective buffers at varying moments, so the
  // harness measures each FSDP2 case three times on each rank and records the range.
  const auto c = compare_steps(oracle::step_rows(oracle::read_corpus("oracle_steps.json")));
  MESSAGE("whole steps compared: "
          << c.peaks << " (" << c.skipped << " set aside), worst peak error " << 100 * c.worst
          << "% (bare and DDP), " << 100 * c.worst_fsdp2 << "% (FSDP2); " << c.misses
          << " FSDP2 misses, worst " << 100 * c.worst_miss << "%");
  CHECK(c.peaks == 128);
  CHECK(c.misses == static_cast<int>(kKnownFsdp2Misses.size()));
}

TEST_CASE("oracle::deepspeed ZeRO-1/2/3 whole-step peaks within 3%, as planner estimate "
          "--deepspeed reads the engine's config") {
  // DeepSpeed 0.19.8's engines on 2 gloo ranks, fp32 and bf16. The config each case ran goes in
  // as --deepspeed: its default reduce bucket (5e8 elements of the gradients' dtype, 2 GB in
  // fp32) is 95-97% of these small models' peaks, so the categories are reported by
  // bench/memory_corpus, not asserted here; the hf-auto corpus below asserts them.
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

TEST_CASE("oracle::deepspeed with transformers' auto bucket sizes: peaks within 3%, categories "
          "within 5%") {
  // The same engines with the reduce bucket transformers' Trainer writes over "auto"
  // (reduce_bucket_size = hidden_size² = 65,536 elements; at stage 3 also the prefetch bucket
  // 0.9·h² and the persistence threshold 10·h): the bucket no longer dominates the peak, so the
  // gradients, partitions and activations are asserted one by one
  // (validation/measure_deepspeed.py --buckets hf-auto: oracle_deepspeed_hf_auto.json).
  const auto c =
      compare_steps(oracle::step_rows(oracle::read_corpus("oracle_deepspeed_hf_auto.json")));
  MESSAGE("DeepSpeed (auto buckets) steps compared: " << c.peaks << ", worst peak error "
                                                      << 100 * c.worst << "%");
  CHECK(c.peaks == 24);
}

TEST_CASE("oracle::stress steps: sequence 1024 under bf16 autocast, peaks in the backward") {
  // Llama with GQA and with MQA over a 512-token vocabulary, GPT-2 with exact GELU, Mistral with
  // a 256-token sliding window; checkpointed or not; bare, DDP and FSDP2
  // (validation/measure_steps.py --grid stress: oracle_steps_stress.json). Where the peaks fall
  // is reported; every checkpointed bare/DDP case peaks in the backward, where autocast's weight
  // casts of the checkpointed blocks are gone.
  const auto corpus = oracle::read_corpus("oracle_steps_stress.json");
  const auto c = compare_steps(oracle::step_rows(corpus));
  std::map<std::string, int> phases;
  for (const auto& k : corpus.at("cases")) ++phases[k.at("peak_phase").get<std::string>()];
  std::string where;
  for (const auto& [phase, n] : phases) where += " " + phase + ": " + std::to_string(n);
  MESSAGE("stress steps compared: " << c.peaks << " (" << c.skipped << " set aside), worst peak "
                                    << 100 * c.worst << "% (bare and DDP), " << 100 * c.worst_fsdp2
                                    << "% (FSDP2); measured peaks by phase:" << where);
  CHECK(phases["backward"] + phases["backward-recompute"] >= 24);
  CHECK(c.peaks >= 40);
}
