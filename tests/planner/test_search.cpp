#include <doctest/doctest.h>

#include <set>

#include <algorithm>

#include <fmt/format.h>

#include "core/input_error.hpp"
#include "documents/plan.hpp"
#include "planner/estimate.hpp"
#include "planner/recommend.hpp"

using namespace shardplan;
using namespace shardplan::planner;

namespace {

Scenario scenario(const char* model, const char* hardware, int gpus, int per_node, std::int64_t seq,
                  std::int64_t global_batch) {
  Scenario sc;
  sc.model = documents::load_model(model);
  sc.hardware = documents::load_hardware(hardware);
  sc.cluster = {gpus, per_node};
  sc.job.seq_len = seq;
  sc.job.global_batch = global_batch;
  return sc;
}

std::string key(const Candidate& c) {
  const auto& e = c.eval;
  return fmt::format("{}/{}/{}/{}/{}/{}/{}/{:.9g}", e.spec.strategy,
                     documents::flavour_name(e.spec.flavour), e.spec.shard_group_size,
                     e.job.micro_batch, documents::checkpointing_name(e.job.checkpointing),
                     documents::offload_name(e.spec.offload), e.spec.forward_prefetch,
                     e.result.step_s);
}

}  // namespace

TEST_CASE("search::pruned ranking equals exhaustive search") {
  const Scenario cases[] = {
      scenario("gpt2", "a100-sxm4-40gb", 8, 8, 1024, 64),
      scenario("llama-2-7b", "a100-sxm4-40gb", 8, 8, 4096, 32),
      scenario("llama-2-13b", "h100-sxm5-80gb", 16, 8, 4096, 64),
      scenario("mistral-7b", "l40s-48gb", 16, 8, 2048, 128),
  };
  for (const auto& sc : cases) {
    CAPTURE(sc.model.name);
    SearchPins fast, full;
    full.exhaustive = true;
    const auto a = search(sc, fast);
    const auto b = search(sc, full);
    CHECK(a.plans_simulated <= b.plans_simulated);
    CHECK(a.plans_considered == b.plans_considered);
    REQUIRE(a.ranked.size() == b.ranked.size());
    for (std::size_t i = 0; i < a.ranked.size(); ++i) CHECK(key(a.ranked[i]) == key(b.ranked[i]));
    REQUIRE(a.best_per_family.size() == b.best_per_family.size());
    for (std::size_t i = 0; i < a.best_per_family.size(); ++i)
      if (a.best_per_family[i].eval.fits)
        CHECK(key(a.best_per_family[i]) == key(b.best_per_family[i]));
    REQUIRE(a.pareto.size() == b.pareto.size());
  }
}

TEST_CASE("search::ranked best first, ties to lower memory") {
  const auto sc = scenario("llama-2-7b", "a100-sxm4-80gb", 8, 8, 4096, 32);
  const auto r = search(sc, {});
  REQUIRE(r.ranked.size() > 10);
  for (std::size_t i = 1; i < r.ranked.size(); ++i)
    CHECK_FALSE(better(r.ranked[i].eval, r.ranked[i - 1].eval));
  for (const auto& c : r.ranked) CHECK(c.eval.result.peak_bytes <= sc.usable_bytes());
  // The Pareto front: each point uses less memory than every faster one.
  for (std::size_t i = 1; i < r.pareto.size(); ++i) {
    CHECK(r.pareto[i].eval.result.peak_bytes < r.pareto[i - 1].eval.result.peak_bytes);
    CHECK(r.pareto[i].eval.result.step_s >= r.pareto[i - 1].eval.result.step_s);
  }
}

TEST_CASE("search::ddp is rejected for memory for llama-2-7b on 8 x a100-sxm4-40gb") {
  // DDP keeps 16 bytes per parameter on every GPU (fp32 parameters, gradients, two Adam moments):
  // 16 × 6,738,415,616 B = 100.4 GiB against 40 GB; the largest of them, the replicated optimizer
  // states, 8 × 6,738,415,616 B = 50.2 GiB. The sentence names what does not fit (all the states
  // with the device's own 0.5 + 0.5 GiB), not the largest part alone, which is below capacity.
  const auto sc = scenario("llama-2-7b", "a100-sxm4-40gb", 8, 8, 4096, 32);
  const auto rec = recommend(sc, {});
  const auto it = std::find_if(rec.search.rejected.begin(), rec.search.rejected.end(),
                               [](const auto& r) { return r.first == "ddp"; });
  REQUIRE(it != rec.search.rejected.end());
  CHECK(it->second == "the model states, 100.4 GiB, and the device's own 1.0 GiB (CUDA context, "
                      "NCCL) exceed 37.6 GiB usable; the largest of them: replicated optimizer "
                      "states, 50.2 GiB");
  REQUIRE_FALSE(rec.search.ranked.empty());
  CHECK(rec.search.ranked.front().eval.spec.strategy != "ddp");
  CHECK(rec.explanation.bottleneck == Bottleneck::memory_capacity);
}

TEST_CASE("search::a small model across nodes of a weak network is not fully sharded") {
  // 4 nodes of 8 GPUs joined by 10 Gb/s Ethernet (1.25 GB/s per node, shared by its 8 GPUs):
  // ZeRO-3/FSDP's 1.5x communication cannot hide; replicate or shard within the node instead.
  auto sc = scenario("gpt2-medium", "l40s-48gb", 32, 8, 1024, 256);
  sc.hardware.inter_bandwidth_Bps = 1.25e9 / 8;
  sc.hardware.inter_latency_s = 30e-6;
  const auto rec = recommend(sc, {});
  REQUIRE_FALSE(rec.search.ranked.empty());
  const auto& best = rec.search.ranked.front().eval.spec;
  CHECK(best.strategy != "zero3");
  CHECK(best.strategy != "fsdp-full");
  CHECK(rec.explanation.bottleneck == Bottleneck::communication);
}

TEST_CASE("search::pins restrict the space") {
  auto sc = scenario("llama-2-7b", "a100-sxm4-80gb", 8, 8, 4096, 32);
  sc.job.checkpointing = documents::Checkpointing::full;
  SearchPins pins;
  pins.strategy = "zero2";
  pins.micro_batch = 1;
  pins.checkpointing = true;
  pins.loss = true;
  const auto r = search(sc, pins);
  REQUIRE_FALSE(r.ranked.empty());
  for (const auto& c : r.ranked) {
    CHECK(c.eval.spec.strategy == "zero2");
    CHECK(c.eval.job.micro_batch == 1);
    CHECK(c.eval.job.checkpointing == documents::Checkpointing::full);
    CHECK(c.eval.job.loss == documents::LossImpl::upcast);
  }
}

TEST_CASE("search::what the recipe lets a user set is searched and recorded") {
  // transformers: checkpointing none, full or every other layer (activation_checkpointing_enable
  // (every_n_layers=2)), the model's own loss, and a loss the user allows (--losses: Liger's
  // fused linear cross-entropy); torchtitan: its op-level selective checkpointing, and its
  // ChunkedLossWrapper (8 chunks) when allowed. Another loss is searched only when allowed: it is
  // a change to the training code.
  auto sc = scenario("llama-3-8b", "a100-sxm4-80gb", 8, 8, 8192, 64);
  SearchPins pins;
  pins.exhaustive = true;
  const auto seen_in = [&] {
    std::set<std::string> seen;
    for (const auto& c : search(sc, pins).ranked)
      seen.insert(documents::checkpointing_label(c.eval.job) + "/" +
                  documents::loss_label(c.eval.job));
    return seen;
  };
  auto seen = seen_in();
  CHECK(seen.count("every:2/upcast") == 1);
  CHECK(seen.count("none/fused-linear") == 0);
  CHECK(seen.count("selective-op/upcast") == 0);
  pins.other_losses = {{documents::LossImpl::fused_linear, 0}};
  seen = seen_in();
  CHECK(seen.count("none/fused-linear") == 1);
  sc.job.recipe = documents::Recipe::torchtitan;
  pins.other_losses.clear();
  seen = seen_in();
  CHECK(seen.count("selective-op/upcast") == 1);
  CHECK(seen.count("selective-op/chunked:8") == 0);
  pins.other_losses = {{documents::LossImpl::chunked, 8}};
  seen = seen_in();
  CHECK(seen.count("selective-op/chunked:8") == 1);
  CHECK(seen.count("none/fused-linear") == 0);
}

TEST_CASE("search::nothing fits is an answer, not an error") {
  // 70B parameters on one 48 GB GPU without offload: the bf16 weights alone are 129 GiB.
  const auto sc = scenario("llama-2-70b", "l40s-48gb", 1, 1, 4096, 1);
  SearchPins pins;
  pins.offload = documents::Offload::none;
  const auto rec = recommend(sc, pins);
  CHECK(rec.search.ranked.empty());
  CHECK(rec.explanation.bottleneck == Bottleneck::memory_capacity);
  CHECK(render(rec.explanation.summary).rfind("nothing fits", 0) == 0);
}

TEST_CASE("search::emitted plan round-trips") {
  const auto sc = scenario("llama-2-7b", "a100-sxm4-80gb", 8, 8, 4096, 32);
  const auto rec = recommend(sc, {});
  const auto& e = rec.search.ranked.front().eval;
  const auto doc = plan_document(sc, e);
  const auto plan = documents::plan_from_json(doc);
  CHECK(plan.model.total_params() == 6738415616);
  CHECK(plan.job.micro_batch == e.job.micro_batch);
  CHECK(documents::spec_to_json(plan.spec) == documents::spec_to_json(e.spec));
  CHECK(plan.prediction.step_s == doctest::Approx(e.result.step_s));
  CHECK(documents::plan_to_json(plan) == doc);
}

TEST_CASE("estimate::three verdicts near the edge") {
  // The same plan against three headrooms: fits (peak within the usable capacity), tight (fits the
  // device only inside the headroom), does not fit (beyond the device itself).
  auto sc = scenario("llama-2-7b", "a100-sxm4-80gb", 8, 8, 4096, 32);
  auto job = sc.job;
  job.micro_batch = 2;
  const auto spec = documents::make_spec("fsdp-full", std::nullopt, 8);
  auto e = evaluate(sc, spec, job);
  const double peak = e.result.peak_bytes, capacity = sc.hardware.memory_bytes;
  REQUIRE(peak < capacity);
  sc.headroom = 1 - (peak / capacity) * 1.01;  // usable just above the peak
  e = evaluate(sc, spec, job);
  CHECK(verdict_of(sc, e) == Verdict::fits);
  CHECK(e.fits);
  sc.headroom = 1 - (peak / capacity) * 0.99;  // usable just below it, the device above
  e = evaluate(sc, spec, job);
  CHECK(verdict_of(sc, e) == Verdict::tight);
  CHECK_FALSE(e.fits);
  CHECK(evaluation_table(sc, e).find("verdict: TIGHT") != std::string::npos);
  CHECK(evaluation_to_json(sc, e)["verdict"] == "tight");
  sc.hardware.memory_bytes = peak * 0.99;
  e = evaluate(sc, spec, job);
  CHECK(verdict_of(sc, e) == Verdict::does_not_fit);
  CHECK(evaluation_to_json(sc, e)["verdict"] == "does not fit");
}

TEST_CASE("search::the recipe's framework decides how it shards") {
  // torchtitan shards with FSDP2 (or replicates with DDP); a model under the DeepSpeed engine
  // uses ZeRO. Pinning another flavour leaves nothing, and the message names the recipe.
  auto sc = scenario("llama-2-7b", "a100-sxm4-80gb", 8, 8, 4096, 32);
  sc.job.recipe = documents::Recipe::torchtitan;
  SearchPins pins;
  pins.exhaustive = true;
  for (const auto& c : search(sc, pins).ranked)
    CHECK((c.eval.spec.flavour == documents::Flavour::fsdp2 ||
           c.eval.spec.flavour == documents::Flavour::ddp));
  sc.job.recipe = documents::Recipe::deepspeed;
  for (const auto& c : search(sc, pins).ranked)
    CHECK(c.eval.spec.flavour == documents::Flavour::deepspeed);
  sc.job.recipe = documents::Recipe::torchtitan;
  pins.flavour = documents::Flavour::deepspeed;
  try {
    search(sc, pins);
    FAIL("expected an input error");
  } catch (const core::InputError& e) {
    CHECK(std::string(e.what()).find("recipe torchtitan") != std::string::npos);
  }
}

// A family whose offloaded plans the host cannot hold says so: llama-3-70b (70,553,706,496
// parameters) on 8 x A100-40GB with the optimizer offloaded keeps 12 B of fp32 master and moments
// and 4 B of fp32 gradient per parameter on the host, 70,553,706,496 / 8 x 16 B = 131.4 GiB per
// GPU, 1051.3 GiB per node of 8 against the profile's 1024 GiB of host memory. Before, the
// ZeRO families, none of whose plans could run, were absent from the rejected without a word.
TEST_CASE("search::a family refused for host memory under offload says so") {
  const auto sc = scenario("llama-3-70b", "a100-sxm4-40gb", 8, 8, 4096, 8);
  SearchPins pins;
  pins.offload = documents::Offload::optimizer;
  const auto rec = recommend(sc, pins);
  for (const char* family : {"zero1", "zero2", "zero3"}) {
    CAPTURE(family);
    const auto it = std::find_if(rec.search.rejected.begin(), rec.search.rejected.end(),
                                 [&](const auto& r) { return r.first == family; });
    REQUIRE(it != rec.search.rejected.end());
    CHECK(it->second == "offloaded, offload needs 1051.3 GiB of host memory per node (8 GPUs x "
                        "131.4 GiB of optimizer states, gradients), the node has 1024.0 GiB");
  }
}
