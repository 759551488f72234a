// From a plan document to what the executor runs: what it refuses, what it runs differently
// and says so; the run document's records; the scaled config the planner reads back.
#include <doctest/doctest.h>

#include "core/input_error.hpp"
#include "documents/plan.hpp"
#include "executor/run_document.hpp"
#include "executor/run_setup.hpp"
#include "executor/scale_config.hpp"
#include "model_fixture.hpp"

using namespace shardplan;
using namespace shardplan::executor;
using namespace shardplan::kernels;
using core::InputError;

namespace {

nlohmann::json plan_document(const std::string& strategy, int gpus) {
  documents::Plan p;
  p.model = documents::model_from_hf_config(
      scaled_config("llama-3-8b",
                    {.layers = 2, .hidden = 16, .heads = 4, .kv_heads = 2, .vocab = 64}),
      "tiny");
  p.hardware = "test-cpu";
  p.cluster = {gpus, gpus};
  p.job.seq_len = 8;
  p.job.global_batch = std::int64_t{4} * gpus;
  p.job.micro_batch = 2;
  p.job.precision = documents::Precision::fp32;
  p.job.attention = documents::AttentionImpl::eager;
  p.job.recipe = documents::Recipe::executor;
  p.spec = documents::make_spec(strategy, std::nullopt, gpus);
  p.prediction.peak_bytes = 1e6;
  return documents::plan_to_json(p);
}

std::string where_of(const nlohmann::json& plan, int world) {
  try {
    make_run_setup(plan, world, {});
  } catch (const InputError& e) {
    return e.where();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("executor::a plan it cannot run as asked is refused, naming the field") {
  auto plan = plan_document("fsdp-full", 2);
  CHECK(where_of(plan, 2) == "accepted");
  CHECK(where_of(plan, 4) == "/cluster/gpus");
  auto bad = plan;
  bad["job"]["precision"] = "bf16";
  CHECK(where_of(bad, 2) == "/job/precision");
  bad["job"]["precision"] = "bf16-mixed";
  CHECK(where_of(bad, 2) == "accepted");
  bad["job"]["precision"] = "fp16-mixed";
  CHECK(where_of(bad, 2) == "accepted");
  bad["sharding"]["reduce_dtype"] = "fp32";  // FSDP's bf16 gradients reduced in fp32
  CHECK(where_of(bad, 2) == "/sharding/reduce_dtype");
  bad = plan;
  bad["job"]["attention"] = "flash";  // the host's tiled kernel (flash_attention_host.hpp)
  CHECK(where_of(bad, 2) == "accepted");
  bad = plan;
  bad["job"]["checkpointing"] = "selective";
  CHECK(where_of(bad, 2) == "/job/checkpointing");
  bad["job"]["checkpointing"] = "every:2";
  CHECK(where_of(bad, 2) == "/job/checkpointing");
  bad = plan;
  bad["job"]["recipe"] = "hf";  // another framework's model code: not what the executor runs
  CHECK(where_of(bad, 2) == "/job/recipe");
  bad = plan;
  bad["sharding"]["flavour"] = "megatron";  // Megatron-core's buffers, not the executor's engine
  CHECK(where_of(bad, 2) == "/sharding/flavour");
  bad = plan;
  bad["job"]["loss"] = "fused";
  CHECK(where_of(bad, 2) == "/job/loss");
  bad = plan;
  bad["job"]["optimizer"] = "sgd";
  CHECK(where_of(bad, 2) == "/job/optimizer");
  bad = plan;
  bad["job"]["float8"] = "rowwise";  // no fp8 GEMMs on a CPU, none among its GPU kernels
  CHECK(where_of(bad, 2) == "/job/float8");
  bad = plan;
  bad["sharding"]["offload"] = "params";  // FSDP's CPUOffload, to host buffers (host_offload.hpp)
  CHECK(where_of(bad, 2) == "accepted");
  bad["sharding"]["offload"] = "optimizer";  // not what FSDP does
  CHECK(where_of(bad, 2) == "/sharding/offload");
  bad = plan;
  bad["sharding"]["shard_group_size"] = 3;
  CHECK(where_of(bad, 2) == "/sharding/shard_group_size");
  try {
    bad = plan;
    bad["sharding"]["offload"] = "params";
    RunRequest gpu;
    gpu.gpu = true;
    make_run_setup(bad, 2, gpu);
    FAIL("the GPU executor accepted an offloading plan");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()).find("the GPU executor does not offload") != std::string::npos);
  }
}

TEST_CASE("executor::a run too big for the host is refused before allocating, naming the flag") {
  const auto plan = plan_document("fsdp-full", 2);
  constexpr double kHost = 64.0 * (1 << 30);  // a 64 GiB host
  RunRequest request;
  const auto as_planned = make_run_setup(plan, 2, request);
  CHECK(least_rank_bytes(as_planned) > 0);
  CHECK(least_rank_bytes(as_planned) < 1e6);
  CHECK_NOTHROW(check_run_size(as_planned, request, kHost));
  // 2^31 tokens per sequence: the head's logits alone are 2 · 2^31 · 64 · 4 bytes; in doubles,
  // nothing wraps.
  request.scale_seq = std::int64_t{1} << 31;
  const auto long_sequences = make_run_setup(plan, 2, request);
  CHECK(least_rank_bytes(long_sequences) > 2.0 * 2147483648.0 * 64 * 4);
  CHECK_THROWS_WITH_AS(
      check_run_size(long_sequences, request, kHost),
      doctest::Contains("--seq-len: micro-batches of 2 sequences of 2147483648 tokens"),
      InputError);
  CHECK_THROWS_WITH_AS(check_run_size(long_sequences, request, kHost),
                       doctest::Contains("more than this host's 64.0 GiB of memory"), InputError);
  CHECK_NOTHROW(check_run_size(long_sequences, request, 0));  // the host's memory unknown
  // Scaled up rather than down: the model size flags are named.
  RunRequest wide;
  wide.scale = ScaledSize{.layers = 1, .hidden = 1 << 20, .heads = 1, .vocab = 1 << 20};
  const auto big_model = make_run_setup(plan, 2, wide);
  try {
    check_run_size(big_model, wide, kHost);
    FAIL("accepted a model of 2^40 parameters on a 64 GiB host");
  } catch (const InputError& e) {
    CHECK(e.where() == "--layers");
  }
}

TEST_CASE("executor::the GPU backend runs flash attention and prefetches as planned") {
  auto plan = plan_document("zero3", 2);
  plan["job"]["attention"] = "flash";
  RunRequest gpu;
  gpu.gpu = true;
  const auto flash = make_run_setup(plan, 2, gpu);
  CHECK(flash.engine.model_options.flash_attention);
  // Collectives on their own streams: the gathers are issued ahead, and no deviation says not.
  CHECK(flash.engine.prefetch_as_planned);
  for (const auto& d : flash.deviations) CHECK(d.find("not prefetched") == std::string::npos);
  plan["job"]["attention"] = "eager";
  CHECK_FALSE(make_run_setup(plan, 2, gpu).engine.model_options.flash_attention);
  // What neither backend runs is refused the same way, naming the backend.
  plan["job"]["precision"] = "bf16-mixed";
  CHECK(make_run_setup(plan, 2, gpu).engine.precision == documents::Precision::bf16_mixed);
  plan["job"]["precision"] = "bf16";  // bf16 optimizer states: neither backend
  try {
    make_run_setup(plan, 2, gpu);
    FAIL("accepted a pure bf16 plan");
  } catch (const InputError& e) {
    CHECK(e.where() == "/job/precision");
    CHECK(std::string(e.what()).find("the GPU executor runs fp32, bf16-mixed and fp16-mixed") !=
          std::string::npos);
  }
}

TEST_CASE("executor::a plan runs with its batch, and the deviations are said") {
  const auto setup = make_run_setup(plan_document("zero3", 2), 2, {});
  CHECK(setup.engine.micro_batch.batch == 2);
  CHECK(setup.engine.micro_batch.seq == 8);
  CHECK(setup.engine.grad_accumulation == 2);
  CHECK_FALSE(setup.scaled);
  // bf16 reduce dtype of DeepSpeed, executed in fp32; the persistence threshold.
  CHECK(setup.deviations.size() >= 2);
  RunRequest scaled;
  scaled.scale = ScaledSize{.layers = 1, .hidden = 8, .heads = 2, .vocab = 32};
  const auto s = make_run_setup(plan_document("ddp", 1), 1, scaled);
  CHECK(s.scaled);
  CHECK(s.engine.model.layers == 1);
}

TEST_CASE("executor::scaled configs have no dropout and read back") {
  const auto config = scaled_config(
      "gpt2", {.layers = 2, .hidden = 32, .heads = 4, .vocab = 100, .max_positions = 64});
  CHECK(config["attn_pdrop"] == 0.0);
  CHECK(config["resid_pdrop"] == 0.0);
  const auto m = documents::model_from_hf_config(config, "x");
  CHECK_FALSE(m.attention_dropout);
  CHECK_FALSE(m.residual_dropout);
  CHECK(m.layers == 2);
  CHECK(m.tied_embeddings);
  CHECK_THROWS_AS(scaled_config("gpt2", {.layers = 2, .hidden = 30, .heads = 4, .vocab = 100}),
                  InputError);
}

TEST_CASE("executor::rank records travel as fixed-length vectors") {
  RankRecord r;
  r.rank = 3;
  r.peak_bytes = 123456789;
  r.at_peak[MemoryCategory::gradients] = 42;
  r.category_peaks[MemoryCategory::buffers] = 7;
  r.capacity_bytes = 1 << 30;
  for (int k = 1; k <= 2; ++k) {
    StepReport s;
    s.step = k;
    s.loss = 4.5 / k;
    s.step_s = 0.25 * k;
    s.collectives[CollectiveKind::reduce_scatter] = {5, 0.125, 4096, 2048};
    r.steps.push_back(s);
  }
  const auto v = pack(r);
  CHECK(v.size() == packed_size(2));
  const auto back = unpack(v, 2);
  CHECK(back.rank == 3);
  CHECK(back.peak_bytes == 123456789);
  CHECK(back.at_peak[MemoryCategory::gradients] == 42);
  CHECK(back.category_peaks[MemoryCategory::buffers] == 7);
  CHECK(back.steps[1].loss == 2.25);
  CHECK(back.steps[1].collectives[CollectiveKind::reduce_scatter].bytes_sent == 2048);
  CHECK(steady_median(back.steps, &StepReport::step_s) == 0.5);
  CHECK(back.capacity_bytes == 1 << 30);
  CHECK_THROWS_AS(unpack(v, 3), std::invalid_argument);
  // No capacity limit (2^63 − 1 bytes, which no double holds) comes back as no limit: it came
  // back as −2^63 through std::llround.
  r.capacity_bytes = TrackedAllocator::kUnlimited;
  CHECK(unpack(pack(r), 2).capacity_bytes == TrackedAllocator::kUnlimited);
  // A count past 2^62 in a record is refused, not wrapped.
  auto bad = pack(r);
  bad[1] = 1e19;  // the peak
  CHECK_THROWS_AS(unpack(bad, 2), std::invalid_argument);
}
