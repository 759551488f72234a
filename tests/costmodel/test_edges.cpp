// Numbers at the edges: the cost model stays finite and non-negative from one GPU to 1,000,000 GPUs
// and up to 100T parameters; zero, negative, non-finite and absurd inputs are rejected naming the
// field; a cluster or batch that does not divide is an error that says what would work.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "core/json_reader.hpp"
#include "costmodel/simulator.hpp"
#include "documents/hardware.hpp"
#include "documents/job.hpp"
#include "documents/model.hpp"
#include "documents/plan.hpp"
#include "documents/sharding.hpp"
#include "tests/test_support.hpp"

using shardplan::test::error_of;
using namespace shardplan::costmodel;
using namespace shardplan::core;
using namespace shardplan::documents;
using nlohmann::json;

namespace {

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

StepResult simulate(const ModelSpec& m, const HardwareProfile& hw, int gpus,
                    const std::string& strategy, std::int64_t seq_len = 2048) {
  StepInput in;
  in.model = &m;
  in.hardware = &hw;
  in.cluster = {gpus, std::min(gpus, hw.gpus_per_node)};
  in.job.seq_len = seq_len;
  in.job.global_batch = gpus;
  in.job.micro_batch = 1;
  in.spec = make_spec(strategy, std::nullopt, in.cluster.gpus_per_node);
  validate_cluster(in.cluster);
  validate_job(in.job, in.cluster);
  return simulate_step(in);
}

// Every number the simulation reports is finite and >= 0, and the peak holds the model states.
void check_sane(const StepResult& r) {
  auto ok = [](double x) { return std::isfinite(x) && x >= 0; };
  CHECK(r.valid);
  CHECK(r.params > 0);
  CHECK(r.micro_batch > 0);
  CHECK(r.grad_accumulation > 0);
  for (double x : {r.peak_bytes, r.allocated_peak_bytes, r.capacity_bytes, r.step_s, r.compute_s,
                   r.recompute_s, r.optimizer_s, r.exposed_comm_s, r.comm_bytes_per_gpu,
                   r.tokens_per_s, r.model_flops, r.mfu})
    CHECK(ok(x));
  for (double x : r.at_peak) CHECK(ok(x));
  for (double x : r.model_states) CHECK(ok(x));
  for (double x : r.busy_s) CHECK(ok(x));
  for (double x : r.exposed_s) CHECK(ok(x));
  CHECK(r.step_s > 0);
  CHECK(r.peak_bytes >= total(r.model_states));
  CHECK(total(r.at_peak) == doctest::Approx(r.peak_bytes).epsilon(1e-9));
}

json job_doc() {
  return {{"schema_version", 1}, {"seq_len", 4096}, {"global_batch", 64}, {"micro_batch", 2}};
}

json hardware_doc() {
  return read_json_file(data_dir() + "/hardware_profiles/h100-sxm5-80gb.json");
}

json llama_doc() { return read_json_file(data_dir() + "/examples/models/llama-2-7b/config.json"); }

}  // namespace

TEST_CASE("edges::100T parameters on 1,000,000 GPUs stay finite") {
  const auto hw = load_hardware("h100-sxm5-80gb");
  const auto m = model_from_param_count(1e14);
  CHECK(m.total_params() == 100'000'000'000'000);
  for (const char* strategy : {"zero3", "ddp"}) {
    for (int gpus : {1, 8, 1024, 1'000'000}) {
      CAPTURE(strategy);
      CAPTURE(gpus);
      const auto r = simulate(m, hw, gpus, strategy);
      check_sane(r);
      // DDP keeps every state on every GPU: at least 16 bytes per parameter in bf16-mixed AdamW.
      if (std::string(strategy) == "ddp") CHECK(total(r.model_states) >= 16e14);
    }
  }
  // ZeRO-3 divides the model states by the GPU count: 100T parameters shard down to ~2 GB per GPU.
  const double one = total(simulate(m, hw, 1, "zero3").model_states);
  CHECK(total(simulate(m, hw, 1'000'000, "zero3").model_states) ==
        doctest::Approx(one / 1e6).epsilon(0.01));
}

TEST_CASE("edges::smallest models and every strategy on 1,000,000 GPUs stay finite") {
  const auto hw = load_hardware("a100-sxm4-80gb");
  for (const auto& m : {model_from_param_count(1e3), model_from_param_count(1e3, 1),
                        load_model("gpt2"), model_from_param_count(1e15)}) {
    for (const auto& strategy : strategy_names()) {
      CAPTURE(m.name);
      CAPTURE(strategy);
      check_sane(simulate(m, hw, 1'000'000, strategy, 128));
    }
  }
}

TEST_CASE("edges::a bare parameter count outside 1e3..1e15 is rejected") {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double p : {0.0, -1.0, -1e14, 999.0, 1.0000001e15, 1e300, inf, -inf, nan}) {
    CAPTURE(p);
    CHECK(starts_with(error_of([&] { model_from_param_count(p); }),
                      "--params: must be between 1e3 and 1e15"));
  }
  CHECK(starts_with(error_of([] { model_from_param_count(1e9, -1); }), "--layers: "));
  CHECK(starts_with(error_of([] { model_from_param_count(1e9, 100001); }), "--layers: "));
}

TEST_CASE("edges::numbers too large for a double are a JSON error, not a value") {
  // 1e400 is valid JSON syntax but overflows a double: the parse fails, naming the document. (It
  // used to escape as nlohmann's out_of_range instead of InputError: found by the fuzz targets.)
  CHECK(starts_with(error_of([] { parse_json_text(R"({"seq_len": 1e400})", "job.json"); }),
                    "job.json: not valid JSON"));
  CHECK(error_of([] { parse_json_text(R"({"memory_GiB": -1e400})", "hw.json"); }) ==
        "hw.json: not valid JSON (number overflow parsing '-1e400')");
  // JSON has no NaN or Infinity literals.
  CHECK(starts_with(error_of([] { parse_json_text(R"({"x": NaN})", "a.json"); }),
                    "a.json: not valid JSON"));
  CHECK(starts_with(error_of([] { parse_json_text(R"({"x": Infinity})", "a.json"); }),
                    "a.json: not valid JSON"));
}

TEST_CASE("edges::training job: zero, negative, fractional, absurd and non-finite values name the "
          "field") {
  auto with = [](const char* key, json v) {
    json j = job_doc();
    j[key] = std::move(v);
    return error_of([&] { job_from_json(j); });
  };
  for (const char* key : {"seq_len", "global_batch", "micro_batch"}) {
    CAPTURE(key);
    const std::string at = std::string("/") + key + ": ";
    CHECK(with(key, 0) == at + "must be >= 1, got 0");
    CHECK(with(key, -1) == at + "must be >= 1, got -1");
    CHECK(with(key, INT64_MIN) == at + "must be >= 1, got -9223372036854775808");
    CHECK(with(key, 2.5) == at + "must be an integer, got 2.5");
    CHECK(with(key, 1e300) == at + "must be an integer, got 1e+300");
    CHECK(with(key, UINT64_MAX) == at + "is too large, got 18446744073709551615");
    CHECK(starts_with(with(key, INT64_MAX), at + "must be <= "));
    CHECK(starts_with(with(key, std::numeric_limits<double>::quiet_NaN()),
                      at + "must be an integer"));
    CHECK(
        starts_with(with(key, std::numeric_limits<double>::infinity()), at + "must be an integer"));
    CHECK(with(key, "8") == at + "must be an integer, got \"8\"");
  }
  CHECK(with("seq_len", 1e8 + 1) == "/seq_len: must be <= 100000000, got 100000001.0");
}

TEST_CASE("edges::hardware profile: zero, negative, absurd and non-finite numbers name the field") {
  struct Field {
    const char* section;
    const char* key;
    bool zero_ok;
  };
  const Field fields[] = {
      {"gpu", "memory_GiB", false},           {"gpu", "memory_bandwidth_GBps", false},
      {"gpu", "compute_efficiency", false},   {"intra_node", "bandwidth_GBps", false},
      {"intra_node", "latency_us", true},     {"inter_node", "bandwidth_GBps_per_gpu", false},
      {"inter_node", "latency_us", true},     {"host", "memory_GiB", false},
      {"host", "link_bandwidth_GBps", false}, {"host", "optimizer_Gparams_per_s", false},
      {"overhead", "cuda_context_GiB", true}, {"overhead", "fragmentation", true}};
  for (const auto& f : fields) {
    const std::string at = std::string("/") + f.section + "/" + f.key;
    CAPTURE(at);
    auto with = [&](const json& v) {
      json doc = hardware_doc();
      doc[f.section][f.key] = v;
      return error_of([&] { hardware_from_json(doc, "h100"); });
    };
    CHECK(starts_with(with(-1), at + ": must be "));
    CHECK(starts_with(with(1e300), at + ": must be <= "));
    CHECK(starts_with(with(std::numeric_limits<double>::quiet_NaN()), at + ": must be finite"));
    CHECK(starts_with(with(-std::numeric_limits<double>::infinity()), at + ": must be finite"));
    CHECK(starts_with(with(true), at + ": must be a number, got true"));
    if (f.zero_ok)
      CHECK(with(0) == "no error");
    else
      CHECK(starts_with(with(0), at + ": must be > 0, got 0"));
  }
  json doc = hardware_doc();
  doc["node"]["gpus_per_node"] = 0;
  CHECK(error_of([&] { hardware_from_json(doc, "h100"); }) ==
        "/node/gpus_per_node: must be >= 1, got 0");
  doc["node"]["gpus_per_node"] = 1025;
  CHECK(error_of([&] { hardware_from_json(doc, "h100"); }) ==
        "/node/gpus_per_node: must be <= 1024, got 1025");
}

TEST_CASE("edges::model config: zero, negative and absurd dimensions name the field") {
  for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "vocab_size", "max_position_embeddings"}) {
    CAPTURE(key);
    const std::string at = std::string("/") + key + ": ";
    auto with = [&](const json& v) {
      json doc = llama_doc();
      doc[key] = v;
      return error_of([&] { model_from_hf_config(doc, "llama"); });
    };
    CHECK(with(0) == at + "must be >= 1, got 0");
    CHECK(with(-4096) == at + "must be >= 1, got -4096");
    CHECK(starts_with(with(1e300), at + "must be an integer"));
    CHECK(starts_with(with(INT64_MAX), at + "must be <= "));
    CHECK(starts_with(with(std::numeric_limits<double>::quiet_NaN()), at + "must be an integer"));
  }
}

TEST_CASE("edges::sharding spec and plan: negative and absurd knobs name the field") {
  const json spec = spec_to_json(make_spec("zero3", std::nullopt, 8));
  for (const char* key :
       {"prefetch_bucket_elems", "reduce_bucket_bytes", "allgather_bucket_bytes"}) {
    CAPTURE(key);
    json bad = spec;
    bad[key] = -1;
    CHECK(starts_with(error_of([&] { spec_from_json(bad, "/sharding"); }),
                      std::string("/sharding/") + key + ": must be >= 0"));
    bad[key] = std::numeric_limits<double>::infinity();
    CHECK(starts_with(error_of([&] { spec_from_json(bad, "/sharding"); }),
                      std::string("/sharding/") + key + ": must be finite"));
  }
  json bad = spec;
  bad["forward_prefetch"] = 10001;
  CHECK(error_of([&] { spec_from_json(bad, "/sharding"); }) ==
        "/sharding/forward_prefetch: must be <= 10000, got 10001");
  bad = spec;
  bad["shard_group_size"] = 1'000'001;
  CHECK(error_of([&] { spec_from_json(bad, "/sharding"); }) ==
        "/sharding/shard_group_size: must be <= 1000000, got 1000001");
}

TEST_CASE("edges::a GPU count that is not a multiple of the node says which would be") {
  CHECK(error_of([] { validate_cluster({1'000'000, 8}); }) == "no error");
  CHECK(error_of([] { validate_cluster({1'000'000, 1000}); }) == "no error");
  CHECK(error_of([] {
          validate_cluster({1'000'001, 1});
        }) == "--gpus: must be between 1 and 1000000, got 1000001");
  CHECK(error_of([] {
          validate_cluster({999'999, 8});
        }) == "--gpus: 999999 is not a multiple of --gpus-per-node 8; 999992 or 1000000 would be");
  CHECK(error_of([] {
          validate_cluster({1025, 1024});
        }) == "--gpus: 1025 is not a multiple of --gpus-per-node 1024; 1024 or 2048 would be");
  // Fewer GPUs than one node holds is one partial node.
  CHECK(error_of([] { validate_cluster({1023, 1024}); }) == "no error");
  CHECK(error_of([] {
          validate_cluster({8, 0});
        }) == "--gpus-per-node: must be between 1 and 1024, got 0");
  CHECK(error_of([] {
          validate_cluster({8, -8});
        }) == "--gpus-per-node: must be between 1 and 1024, got -8");
  CHECK(error_of([] {
          validate_cluster({-1, 8});
        }) == "--gpus: must be between 1 and 1000000, got -1");
  CHECK(error_of([] {
          validate_cluster({8, 1025});
        }) == "--gpus-per-node: must be between 1 and 1024, got 1025");
}

TEST_CASE("edges::a suggested GPU count is itself allowed") {
  // 1,000,000 is not a multiple of 1024: the next multiple up (1,000,448) is over the limit, so
  // only the one below is offered.
  CHECK(error_of([] {
          validate_cluster({1'000'000, 1024});
        }) == "--gpus: 1000000 is not a multiple of --gpus-per-node 1024; 999424 would be");
  CHECK(error_of([] {
          validate_cluster({999'999, 1000});
        }) ==
        "--gpus: 999999 is not a multiple of --gpus-per-node 1000; 999000 or 1000000 would be");
}

TEST_CASE("edges::a batch that does not divide says what would work") {
  TrainingJob j;
  j.global_batch = 999'999'999;
  CHECK(error_of([&] {
          validate_job(j, {1'000'000, 8});
        }) == "--global-batch: 999999999 sequences do not divide over 1000000 GPUs; use a multiple "
              "of 1000000");
  j.global_batch = 1;
  CHECK(error_of([&] {
          validate_job(j, {1'000'000, 8});
        }) ==
        "--global-batch: 1 sequences do not divide over 1000000 GPUs; use a multiple of 1000000");
  j.global_batch = 1'000'000'000;
  CHECK(error_of([&] { validate_job(j, {1'000'000, 8}); }) == "no error");
  j.micro_batch = 7;
  CHECK(error_of([&] {
          validate_job(j, {1'000'000, 8});
        }) == "--micro-batch: 7 does not divide the 1000 sequences per GPU (global batch "
              "1000000000 / 1000000 GPUs)");
  j.micro_batch = 1000;
  CHECK(error_of([&] { validate_job(j, {1'000'000, 8}); }) == "no error");
}

// Regressions found by feeding the fuzz targets (tests/fuzz) hostile documents.

TEST_CASE("edges::a deeply nested document is rejected before it can overflow the stack") {
  // 20000 levels of '[' parsed fine, and then describing the value in the error message
  // (nlohmann's dump, recursive per level) overflowed the stack.
  const std::string deep =
      R"({"schema_version": )" + std::string(20000, '[') + std::string(20000, ']') + "}";
  CHECK(error_of([&] { job_from_json(parse_json_text(deep, "job.json")); }) ==
        "job.json: nested deeper than 100 levels (byte 118)");
  // Brackets inside strings do not count; 100 levels are fine.
  CHECK_NOTHROW(parse_json_text(R"({"a": ")" + std::string(500, '[') + R"("})", "a.json"));
  CHECK_NOTHROW(parse_json_text(std::string(100, '[') + std::string(100, ']'), "a.json"));
  CHECK(starts_with(
      error_of([] { parse_json_text(std::string(101, '[') + std::string(101, ']'), "a.json"); }),
      "a.json: nested deeper than 100 levels"));
}

TEST_CASE("edges::model dimensions whose product overflows 64 bits are rejected") {
  // Every dimension within its bound, but hidden 1e7 x intermediate 1e7 per MLP matrix x 1e5
  // layers is 7e19 parameters (signed overflow in total_params).
  json doc = llama_doc();
  doc["hidden_size"] = 10'000'000;
  doc["intermediate_size"] = 10'000'000;
  doc["num_hidden_layers"] = 100'000;
  doc["num_attention_heads"] = 1;
  doc["num_key_value_heads"] = 1;
  CHECK(error_of([&] { model_from_hf_config(doc, "llama"); }) ==
        "/: the dimensions give 7e+19 parameters (7e+14 per block x 100000 blocks); at most 1e+15 "
        "are "
        "supported");
  // An explicit head_dim: q_proj alone is (1e7 heads x 1e7) x 1e7 hidden = 1e21 elements.
  doc = llama_doc();
  doc["hidden_size"] = 10'000'000;
  doc["num_attention_heads"] = 10'000'000;
  doc["num_key_value_heads"] = 1;
  doc["head_dim"] = 10'000'000;
  CHECK(starts_with(error_of([&] { model_from_hf_config(doc, "llama"); }),
                    "/: the dimensions give 6.4e+22 parameters (2e+21 per block x 32 blocks)"));
  // The largest model that is allowed still counts exactly.
  doc = llama_doc();
  doc["num_hidden_layers"] = 100'000;  // 100000 llama-2-7b blocks: 2.02e13 parameters
  const auto m = model_from_hf_config(doc, "llama");
  CHECK(m.total_params() == 2 * 32000 * 4096 + 4096 + 100'000LL * 202'383'360);
}

TEST_CASE("edges::plan byte counts that cannot be written back are rejected") {
  // plan_to_json writes byte counts as 64-bit integers: a plan read with 1e300 peak bytes was
  // written back as -9223372036854775808 and could not be read again.
  Plan p;
  p.model = model_from_param_count(1e9, 8);
  p.hardware = "a100-sxm4-80gb";
  p.cluster = {8, 8};
  p.job.global_batch = 8;
  p.job.micro_batch = 1;
  p.spec = make_spec("zero3", std::nullopt, 8);
  p.prediction.peak_bytes = 1e18;  // the largest allowed round-trips exactly
  const json written = plan_to_json(p);
  CHECK(plan_to_json(plan_from_json(written)) == written);
  CHECK(written["prediction"]["peak_bytes"] == 1'000'000'000'000'000'000LL);
  json bad = written;
  bad["prediction"]["peak_bytes"] = 1e300;
  CHECK(error_of([&] { plan_from_json(bad); }) ==
        "/prediction/peak_bytes: must be <= 1e+18, got 1e+300");
  bad = written;
  bad["prediction"]["breakdown"]["activations"] = 1e19;
  CHECK(error_of([&] { plan_from_json(bad); }) ==
        "/prediction/breakdown/activations: must be <= 1e+18, got 1e+19");
  bad = written;
  bad["prediction"]["peak_bytes"] = -1;
  CHECK(error_of([&] { plan_from_json(bad); }) == "/prediction/peak_bytes: must be >= 0, got -1");
}
