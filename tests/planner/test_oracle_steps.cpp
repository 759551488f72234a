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
#include <string>
#include <utility>
#include <vector>

#include "oracle_step_rows.hpp"

using namespace shardplan;

namespace {

bool is_fsdp2(const oracle::Row& r) { return r.case_id.rfind("fsdp2/", 0) == 0; }

struct Compared {
  int peaks = 0, skipped = 0;
  double worst = 0, worst_fsdp2 = 0;
};

// Whether a row is within its target: a peak within 3% of what was measured (of the nearest end
// of the range where the case was measured on several ranks or more than once); a bare, DDP or
// DeepSpeed category within 5% of itself, or, when under 2% of the peak (the batch's token ids,
// the loss scalar), within 1% of the peak. FSDP2's parameters and optimizer states likewise; its
// gradients, activations and buffers not one by one: FSDPMemTracker files a gradient made in the
// backward, and the reduce-scatter's output, as temporaries until post_backward labels them, so
// it splits the same bytes otherwise than the walk; their sum, the peak less the two compared,
// is bounded by the peak's target.
bool within(const oracle::Row& r, double peak) {
  if (r.quantity == "peak") return std::abs(r.range_error()) < 0.03;
  if (is_fsdp2(r) && r.quantity != "peak/parameters" && r.quantity != "peak/optimizer_states")
    return true;
  const double diff = std::abs(r.predicted - r.measured);
  if (std::max(r.predicted, r.measured) >= 0.02 * peak) return diff <= 0.05 * r.measured;
  return diff <= 0.01 * peak;
}

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
                   << r.measured << " (over ranks and repeats: " << r.measured_low << " .. "
                   << r.measured_high << ")");
    const bool ok = within(r, peak_of.at(r.case_id));
    const double error = std::abs(r.range_error());
    if (r.quantity == "peak") {
      ++c.peaks;
      double& worst = is_fsdp2(r) ? c.worst_fsdp2 : c.worst;
      worst = std::max(worst, error);
    }
    CHECK(ok);
  }
  return c;
}

// accelerate's whole-step peaks whose case id starts with `prefix` (oracle_accelerate_steps.json):
// each within `bound` of what was measured. Returns the cases compared and the worst error.
std::pair<int, double> accelerate_peaks(const std::string& prefix, double bound) {
  int peaks = 0;
  double worst = 0;
  for (const auto& r : oracle::step_rows(oracle::read_corpus("oracle_accelerate_steps.json"))) {
    if (r.quantity != "peak" || !r.skipped.empty() || r.case_id.rfind(prefix, 0) != 0) continue;
    ++peaks;
    INFO(r.case_id << ": predicted " << r.predicted << ", measured " << r.measured
                   << " (over ranks: " << r.measured_low << " .. " << r.measured_high << ")");
    worst = std::max(worst, std::abs(r.range_error()));
    CHECK(std::abs(r.range_error()) < bound);
  }
  return {peaks, worst};
}

}  // namespace

TEST_CASE("oracle::whole-step peaks within 3%, categories within 5%") {
  // FSDP2 on gloo CPU ranks, measured as FSDP2 holds memory under NCCL (measure_steps.py: the
  // tracker's own reference to a gradient dropped, gloo's reduce-scatter copies counted apart);
  // each case three times on each rank, the range recorded.
  const auto c = compare_steps(oracle::step_rows(oracle::read_corpus("oracle_steps.json")));
  MESSAGE("whole steps compared: " << c.peaks << " (" << c.skipped << " set aside), worst peak "
                                   << "error " << 100 * c.worst << "% (bare and DDP), "
                                   << 100 * c.worst_fsdp2 << "% (FSDP2)");
  CHECK(c.peaks == 128);
  // Each FSDP2 peak is within 0.22% here; bound at the unit corpus's 1%, so that a moment the
  // walk loses (a released tensor, a transient) shows before it reaches the step target.
  CHECK(c.worst_fsdp2 < 0.01);
}

TEST_CASE("oracle::mixtures of experts' whole-step peaks within 3%, categories within 5%") {
  // transformers' Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE (8 experts, top-2, llama-h256's shape)
  // on their default experts path, as measure_steps.py measures the dense models
  // (validation/measure_moe_steps.py: tests/costmodel/data/oracle_moe_steps.json): bare, DDP on 1
  // and 2 gloo ranks, FSDP2 on 2.
  const auto c = compare_steps(oracle::step_rows(oracle::read_corpus("oracle_moe_steps.json")));
  MESSAGE("MoE whole steps compared: " << c.peaks << " (" << c.skipped << " set aside), worst "
                                       << "peak error " << 100 * c.worst << "% (bare and DDP), "
                                       << 100 * c.worst_fsdp2 << "% (FSDP2)");
  CHECK(c.peaks == 256);
  // Bare and DDP within 0.002%; FSDP2 up to 2.07% under at 256 tokens a micro-batch, a miss of
  // zero spread inside the experts' backward (costmodel/block_table.cpp, mlp_backward_transient):
  // bounded where it stands, so that it cannot grow unseen behind the 3% target.
  CHECK(c.worst < 0.0001);
  CHECK(c.worst_fsdp2 < 0.021);
}

TEST_CASE("oracle::deepspeed ZeRO stages 0-3 whole-step peaks within 3%, as planner estimate "
          "--deepspeed reads the engine's config") {
  // DeepSpeed 0.19.8's engines on 2 gloo ranks, fp32 and bf16. The config each case ran goes in
  // as --deepspeed: at stages 1-3 its default reduce bucket (5e8 elements of the gradients'
  // dtype, 2 GB in fp32) is 95-97% of these small models' peaks, so the categories are reported
  // by bench/memory_corpus, not asserted here; the hf-auto corpus below asserts them. Stage 0
  // and BF16_Optimizer have no bucket: its cases run the script's torch AdamW (no optimizer
  // section; bf16 under FP16_UnfusedOptimizer) and DeepSpeed's own FusedAdam (an "optimizer"
  // section, "/ds-adamw"; bf16 under FP16_Optimizer), and their categories at the peak are asserted
  // like the hf-auto corpus's.
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
  CHECK(peaks == 44);
  // The engines without ZeRO's reduce bucket, their categories too: stage 0, and BF16_Optimizer
  // ("/accum-fp32": bf16 at stage 1 with data_types.grad_accum_dtype fp32; its fp32
  // accumulation buffer, the bf16 .grad beside it, the buffer's bf16 cast at the all-reduce).
  std::vector<oracle::Row> unbucketed;
  for (const auto& r : oracle::step_rows(oracle::read_corpus("oracle_deepspeed.json")))
    if (r.case_id.rfind("deepspeed-zero0/", 0) == 0 ||
        r.case_id.find("/accum-fp32") != std::string::npos)
      unbucketed.push_back(r);
  const auto c = compare_steps(unbucketed);
  MESSAGE("DeepSpeed stage 0 and BF16_Optimizer: " << c.peaks << " steps, worst peak error "
                                                   << 100 * c.worst << "%");
  CHECK(c.peaks == 20);
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
  int checkpointed_in_backward = 0;
  for (const auto& k : corpus.at("cases")) {
    const std::string phase = k.at("peak_phase").get<std::string>();
    ++phases[phase];
    checkpointed_in_backward += k.at("wrapper") != "fsdp2" && k.at("checkpointing") == "full" &&
                                phase.rfind("backward", 0) == 0;
  }
  std::string where;
  for (const auto& [phase, n] : phases) where += " " + phase + ": " + std::to_string(n);
  MESSAGE("stress steps compared: " << c.peaks << " (" << c.skipped << " set aside), worst peak "
                                    << 100 * c.worst << "% (bare and DDP), " << 100 * c.worst_fsdp2
                                    << "% (FSDP2); measured peaks by phase:" << where);
  CHECK(checkpointed_in_backward == 24);  // every checkpointed bare/DDP case of the grid
  CHECK(c.peaks == 64);
}

TEST_CASE("oracle::FSDP1 under Composer's mixed precision modes: whole-step peaks within 3%") {
  // FSDP1 (one unit per decoder layer, the root the rest, use_orig_params) on 2 gloo ranks in
  // fp32 and under Composer's DEFAULT, PURE and FULL with CPU autocast
  // (validation/measure_fsdp1_steps.py: oracle_fsdp1_steps.json), predicted with
  // --fsdp-mixed-precision on the profile as a CPU rank, whose collectives block as gloo's do
  // (oracle_step_rows.cpp). MemTracker cannot hook FSDP1's parameter views, so it files the flat
  // gradients by the ops that make them: the peaks are asserted, the categories reported by
  // bench/memory_corpus.
  int peaks = 0;
  double worst = 0;
  for (const auto& r : oracle::step_rows(oracle::read_corpus("oracle_fsdp1_steps.json"))) {
    if (r.quantity != "peak" || !r.skipped.empty()) continue;
    ++peaks;
    worst = std::max(worst, std::abs(r.range_error()));
    INFO(r.case_id << ": predicted " << r.predicted << ", measured " << r.measured
                   << " (over ranks and repeats: " << r.measured_low << " .. " << r.measured_high
                   << ")");
    CHECK(std::abs(r.range_error()) < 0.03);
  }
  MESSAGE("FSDP1 steps compared: " << peaks << ", worst peak error " << 100 * worst << "%");
  CHECK(peaks == 64);
  // Each peak is within 0.26% here; bound at 1%, so that a moment the walk loses shows first.
  CHECK(worst < 0.01);
}

TEST_CASE("oracle::accelerate's own FSDP2: whole-step peaks within 1%") {
  // transformers' models prepared by accelerate 1.16.0 itself on 2 gloo ranks
  // (validation/measure_accelerate_steps.py: oracle_accelerate_steps.json): FSDP2 with its
  // groups (the embedding, each layer, the final norm with the head kept gathered: the hf
  // recipe's --fsdp2-groups ends) and its MixedPrecisionPolicy, no autocast. Measured with the
  // multi-module group's hooks as FSDP2 registers them (validation/fsdp2_on_gloo.py,
  // FSDPGroupHooksProbe: FSDPMemTracker's own per-module hooks had given the [norm, lm_head]
  // group a second gather in backward, Llama fp32 b 1 +2.3%, and GPT-2's tied tail group an
  // early reduce-scatter, up to -7%). GPT-2's tail group [ln_f, wte, lm_head] holds the tied
  // table: gathered from the embedding's lookup, it gets no post-backward hook of its own (wte's
  // input, the token ids, needs no gradient), so its unsharded gradients stay to the root's final
  // callback, and the loss's backward runs before its pre-backward hook (was -8.9% and -3.1% in
  // fp32, none b 1 and full b 2, without that; now -0.22% and -0.0004%).
  const auto [peaks, worst] = accelerate_peaks("accelerate-fsdp2/", 0.01);
  MESSAGE("accelerate FSDP2 steps compared: " << peaks << ", worst peak error " << 100 * worst
                                              << "%");
  CHECK(peaks == 16);
}

TEST_CASE("oracle::accelerate's own FSDP1: whole-step peaks within 0.3%") {
  // The same models under accelerate 1.16.0's FSDP1 preparation (oracle_accelerate_steps.json):
  // FULL_SHARD, backward_prefetch None (the hf recipe's, as transformers' Trainer passes
  // NO_PREFETCH), limit_all_gathers, its MixedPrecision (PURE under bf16) with autocast, each
  // decoder layer a unit. Predicted as a CPU rank, as the Composer FSDP1 cases above. GPT-2 in
  // fp32 under full checkpointing at b = 1 peaks in the embeddings' backward, where the tied
  // table's two gradients and their out-of-place sum are alive at once (a profile of the step
  // without the tracker: EmbeddingBackward0 > aten::add), 2.96% above the walk until the walk
  // held that moment under FSDP1 too.
  const auto [peaks, worst] = accelerate_peaks("accelerate-fsdp1/", 0.003);
  MESSAGE("accelerate FSDP1 steps compared: " << peaks << ", worst peak error " << 100 * worst
                                              << "%");
  CHECK(peaks == 16);
}

TEST_CASE("oracle::deepspeed bytes sent per rank within 1% of what the engine asks for") {
  // Each DeepSpeed case records the collectives of its measured step as deepspeed.comm was asked
  // for them (validation/measure_deepspeed.py, CollectiveCounter): nccl-tests sizes times the
  // ring's bus factor, as the estimate counts. DeepSpeed 0.19.8's stages 1/2 all-reduce each
  // gradient bucket (use_multi_rank_bucket_allreduce) and all-gather the updated weights; stage
  // 3 reduce-scatters the gradients, gathers the sharded parameters in forward and backward and
  // the persistent ones after the step. Each collective is compared where it carries at least 1%
  // of the case's bytes (the engine's gradient-norm all-reduce of 8 bytes and a few small
  // broadcasts are not modelled), and the total always.
  int cases = 0;
  double worst = 0;
  for (const char* file : {"oracle_deepspeed.json", "oracle_deepspeed_hf_auto.json",
                           "oracle_deepspeed_executor.json"}) {
    std::vector<oracle::Row> by_collective;  // the case's rows come before its total
    for (const auto& r : oracle::comm_rows(oracle::read_corpus(file))) {
      if (r.quantity != "bytes/total") {
        by_collective.push_back(r);
        continue;
      }
      ++cases;
      for (const auto& op : by_collective) {
        if (op.measured < 0.01 * r.measured) continue;
        INFO(file << " " << op.case_id << " " << op.quantity << ": predicted " << op.predicted
                  << ", measured " << op.measured);
        CHECK(std::abs(op.error()) < 0.01);
      }
      by_collective.clear();
      worst = std::max(worst, std::abs(r.error()));
      INFO(file << " " << r.case_id << " " << r.quantity << ": predicted " << r.predicted
                << ", measured " << r.measured);
      CHECK(std::abs(r.error()) < 0.01);
    }
  }
  MESSAGE("DeepSpeed steps' traffic compared: " << cases << ", worst total error " << 100 * worst
                                                << "%");
  CHECK(cases == 44 + 24 + 3);
}
