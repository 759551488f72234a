// --float8: torchao's Float8 training of the linears as torchtitan's Float8LinearConverter
// applies it (torchao 0.18, torchtitan 0.3.0): which GEMMs run in fp8, the casts it adds, what it
// refuses, and the job document's fields.
#include <doctest/doctest.h>

#include <algorithm>
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli_fixture.hpp"
#include "documents/job.hpp"
#include "tests/test_support.hpp"

using namespace shardplan::documents;
using shardplan::planner::testing::planner;
using shardplan::test::error_of;

namespace {

// Llama-3-8B under torchtitan on 8 x H100, one sequence of 4096 tokens per GPU and step, its
// blocks compiled and kept whole (checkpointing none).
nlohmann::json titan(std::vector<std::string> more, bool compile = true) {
  std::vector<std::string> a = {"estimate",
                                "--model",
                                "llama-3-8b",
                                "--hardware",
                                "h100-sxm5-80gb",
                                "--gpus",
                                "8",
                                "--seq-len",
                                "4096",
                                "--global-batch",
                                "8",
                                "--micro-batch",
                                "1",
                                "--strategy",
                                "fsdp-full",
                                "--recipe",
                                "torchtitan",
                                "--compile",
                                "--checkpointing",
                                "none",
                                "--format",
                                "json"};
  if (!compile) std::erase(a, std::string("--compile"));
  if (std::find(more.begin(), more.end(), "--checkpointing") != more.end()) {  // theirs, not none
    const auto at = std::find(a.begin(), a.end(), "--checkpointing");
    a.erase(at, at + 2);
  }
  a.insert(a.end(), more.begin(), more.end());
  const auto r = planner(a);
  REQUIRE(r.code == 0);
  return nlohmann::json::parse(r.out);
}

double kind_s(const nlohmann::json& e, const char* kind) {
  return e.at("time").at("compute_by_kind_s").at(kind).get<double>();
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// recommend for Llama-3-8B compiled under torchtitan on 8 x H100 at seq 8192, micro-batch 2,
// without recompute: no 16-bit data-parallel plan fits (the tests below).
std::vector<std::string> compiled_8b_recommend() {
  return {"recommend", "--model",    "llama-3-8b",     "--gpus",    "8",
          "--seq-len", "8192",       "--global-batch", "16",        "--micro-batch",
          "2",         "--recipe",   "torchtitan",     "--compile", "--checkpointing",
          "none",      "--hardware", "h100-sxm5-80gb"};
}

}  // namespace

// rowwise runs all three GEMMs of every converted linear (the block's five and lm_head: every
// size a multiple of 16) on fp8 operands: at T = 4096 tokens each GEMM is compute-bound, and the
// H100 SXM's dense fp8 peak (1979) is twice its bf16 one (989.5), so the GEMM time halves.
// rowwise_with_gw_hp keeps the weight gradient's GEMM in bf16: between the two.
TEST_CASE("float8::the converted linears' GEMMs run at the fp8 peak") {
  const auto bf16 = titan({});
  const auto rowwise = titan({"--float8", "rowwise"});
  const auto gw_hp = titan({"--float8", "rowwise_with_gw_hp"});
  CHECK(bf16.at("float8") == "none");
  CHECK(rowwise.at("float8") == "rowwise");
  CHECK(kind_s(rowwise, "gemm") == doctest::Approx(kind_s(bf16, "gemm") / 2).epsilon(1e-12));
  CHECK(kind_s(gw_hp, "gemm") > kind_s(rowwise, "gemm"));
  CHECK(kind_s(gw_hp, "gemm") < kind_s(bf16, "gemm"));
  CHECK(kind_s(rowwise, "attention") == kind_s(bf16, "attention"));
  CHECK(rowwise.at("time").at("step_s").get<double>() < bf16.at("time").at("step_s").get<double>());
  // Compiled with every linear in Float8, the partition keeps neither norm's output nor w2's input
  // (tests/costmodel/test_oracle_float8.cpp): 4·T·h + 2·T·I bytes fewer per block, 32 blocks at
  // T = 4096, h = 4096, I = 14,336: 32 x (67,108,864 + 117,440,512) = 5,905,580,032 bytes less
  // activation; eager, torchao saves what aten::mm does, and the peak is the bf16 job's.
  const auto activations = [](const nlohmann::json& e) {
    return e.at("memory").at("breakdown").at("activations").get<double>();
  };
  CHECK(activations(bf16) - activations(rowwise) == 5905580032.0);
  const auto eager = titan({"--float8", "rowwise"}, false);
  const auto eager_bf16 = titan({}, false);
  CHECK(eager.at("memory").at("peak_bytes") == eager_bf16.at("memory").at("peak_bytes"));
}

// The casts, by hand from torchao 0.18's float8_linear.py (matmul_with_hp_or_float8_args): per
// linear y[T, out] = x[T, in]·Wᵀ, rowwise casts forward x (T·in) and W (out·in); backward the
// output gradient twice (2·T·out, once per axis), W again (out·in) and x again (T·in). Compiled,
// each cast moves 5 bytes per element (the amax pass reads 2, the cast reads 2 and writes 1).
// Llama-3-8B under torchtitan's block (T = 4096; in: wqkv, wo, w1, w3 4096, w2 14336; out: wqkv
// 6144, wo 4096, w1 14336, w3 14336, w2 4096): Σin = 30,720, Σout = 43,008, ΣW = 4096·53,248 =
// 218,103,808; per block T·Σin·2 + 2·T·Σout + 2·ΣW = 251,658,240 + 352,321,536 + 436,207,616 =
// 1,040,187,392 elements. lm_head (in 4096, out 128,256, W 525,336,576): 2·T·4096 + 2·T·128,256
// + 2·W = 33,554,432 + 1,050,673,152 + 1,050,673,152 = 2,134,900,736. The step (one micro-batch)
// casts 32 blocks' and the head's: 35,420,897,280 elements, 177,104,486,400 bytes at the
// profile's streaming rate (3350 GB/s x 0.92).
TEST_CASE("float8::the casts move the bytes torchao's rowwise recipe moves") {
  const auto bf16 = titan({});
  const auto rowwise = titan({"--float8", "rowwise"});
  const double rate = 3350e9 * 0.92;
  CHECK(kind_s(rowwise, "memory_bound") - kind_s(bf16, "memory_bound") ==
        doctest::Approx(177104486400.0 / rate).epsilon(1e-9));
  // --float8-filter lm_head (torchtitan's 405B preset): the head's casts go, its GEMMs are bf16.
  const auto filtered = titan({"--float8", "rowwise", "--float8-filter", "lm_head"});
  CHECK(kind_s(filtered, "memory_bound") - kind_s(bf16, "memory_bound") ==
        doctest::Approx((177104486400.0 - 5 * 2134900736.0) / rate).epsilon(1e-9));
  CHECK(kind_s(filtered, "gemm") > kind_s(rowwise, "gemm"));
}

TEST_CASE("float8::refused where it is not modeled or cannot run") {
  auto run = [](std::vector<std::string> more) {
    std::vector<std::string> a = {"estimate", "--model",    "llama-3-8b",    "--gpus",
                                  "8",        "--seq-len",  "4096",          "--global-batch",
                                  "16",       "--hardware", "h100-sxm5-80gb"};
    a.insert(a.end(), more.begin(), more.end());
    return planner(a);
  };
  const auto hf = run({"--recipe", "hf", "--float8", "rowwise"});
  CHECK(hf.code == 2);
  CHECK(hf.err == "planner: --float8: rowwise: recipe hf has no Float8 training modeled; "
                  "torchtitan's is (--recipe torchtitan)\n");
  const auto name = run({"--recipe", "torchtitan", "--float8", "tensorwise"});
  CHECK(name.code == 2);
  CHECK(has(name.err, "--float8: must be one of none, rowwise, rowwise_with_gw_hp, got "
                      "\"tensorwise\""));
  const auto a100 =
      planner({"estimate", "--model", "llama-3-8b", "--gpus", "8", "--seq-len", "4096",
               "--global-batch", "16", "--hardware", "a100-sxm4-80gb", "--recipe", "torchtitan",
               "--checkpointing", "full", "--float8", "rowwise"});
  CHECK(a100.code == 2);
  CHECK(has(a100.err, "--float8: rowwise: a100-sxm4-80gb (NVIDIA A100-SXM4-80GB) has no fp8 "
                      "tensor cores"));
  const auto fp32 = run({"--recipe", "torchtitan", "--checkpointing", "full", "--precision", "fp32",
                         "--float8", "rowwise"});
  CHECK(fp32.code == 2);
  CHECK(has(fp32.err, "--float8: rowwise: Float8 training casts the linears' bf16 inputs"));
  // Compiled, the partition is measured with every linear of the block in Float8.
  const auto part = run({"--recipe", "torchtitan", "--compile", "--checkpointing", "full",
                         "--float8", "rowwise", "--float8-filter", "attention.wo"});
  CHECK(part.code == 2);
  CHECK(has(part.err, "--float8-filter: attention.wo: leaves attention.wo in 16 bits; what a "
                      "compiled block keeps with some of its linears in 16 bits is not measured"));
  // "layers.1" is in layers.1 and layers.10-19's names, not in the others': blocks unlike.
  const auto uneven = run({"--recipe", "torchtitan", "--checkpointing", "full", "--float8",
                           "rowwise", "--float8-filter", "layers.1"});
  CHECK(uneven.code == 2);
  CHECK(has(uneven.err, "--float8-filter: layers.1: matches a linear in some blocks"));
  const auto automatic = run({"--recipe", "torchtitan", "--checkpointing", "full", "--float8",
                              "rowwise", "--float8-filter", "lm_head,auto_filter_small_kn"});
  CHECK(automatic.code == 2);
  CHECK(has(automatic.err, "--float8-filter: auto_filter_small_kn: torchtitan 0.3.0's converter "
                           "then converts no linear"));
  const auto lone = run({"--recipe", "torchtitan", "--float8-filter", "lm_head"});
  CHECK(lone.code == 2);
  CHECK(has(lone.err, "--float8-filter: lm_head: a filter of Float8's conversion, and no "
                      "--float8 recipe is named"));
}

TEST_CASE("float8::the job document carries it") {
  nlohmann::json doc = {{"schema_version", 1}, {"seq_len", 128},
                        {"global_batch", 8},   {"recipe", "torchtitan"},
                        {"float8", "rowwise"}, {"float8_filter", {"lm_head", "attention.wo"}}};
  const TrainingJob j = job_from_json(doc);
  CHECK(j.float8 == Float8Recipe::rowwise);
  CHECK(j.float8_filter == std::vector<std::string>{"lm_head", "attention.wo"});
  CHECK(job_to_json(j).at("float8") == "rowwise");
  CHECK(job_to_json(j).at("float8_filter") == doc.at("float8_filter"));
  doc["float8"] = "fp8";
  CHECK(error_of([&] { job_from_json(doc); }) ==
        "/float8: must be one of none, rowwise, rowwise_with_gw_hp, got \"fp8\"");
  doc["float8"] = "rowwise";
  doc["float8_filter"] = {"lm_head", 3};
  CHECK(error_of([&] { job_from_json(doc); }) ==
        "/float8_filter/1: must be a non-empty module name, got 3");
}

// torchtitan 0.3.0 configures Float8 as a model converter of the config_registry entry
// (Float8LinearConverter.Config: recipe_name, filter_fqns, model_compile_enabled), not on its
// command line: the emitted settings say where it goes, with the plan's values.
TEST_CASE("float8::the emitted torchtitan settings carry the converter") {
  const auto r = planner({"recommend",
                          "--model",
                          "llama-3-8b",
                          "--gpus",
                          "8",
                          "--seq-len",
                          "8192",
                          "--global-batch",
                          "16",
                          "--recipe",
                          "torchtitan",
                          "--compile",
                          "--checkpointing",
                          "full",
                          "--float8",
                          "rowwise_with_gw_hp",
                          "--float8-filter",
                          "lm_head",
                          "--hardware",
                          "h100-sxm5-80gb",
                          "--model-parallel",
                          "--emit",
                          "torchtitan"});
  REQUIRE(r.code == 0);
  CHECK(has(r.out,
            "model_spec = model_registry(<flavour>, converters=[Float8LinearConverter.Config("
            "\n#       recipe_name=\"rowwise_with_gw_hp\", filter_fqns=[\"lm_head\"], "
            "model_compile_enabled=True)])"));
  CHECK(has(r.out, "# Float8 (rowwise_with_gw_hp): not written for 0.2.x"));
}

// The search does not turn Float8 on (it changes the training's numerics); where the recipe and
// the GPU offer it, the answer gives the recommended plan again with torchtitan's default recipe
// (rowwise), its step and peak computed, not asserted.
TEST_CASE("float8::recommend says what Float8 would give the recommended plan") {
  auto rec = [](const char* hardware, std::vector<std::string> more) {
    std::vector<std::string> a = {
        "recommend",  "--model",   "llama-3-8b",      "--gpus", "8",
        "--seq-len",  "8192",      "--global-batch",  "16",     "--recipe",
        "torchtitan", "--compile", "--checkpointing", "full",   "--hardware",
        hardware};
    a.insert(a.end(), more.begin(), more.end());
    return planner(a);
  };
  const auto h100 = rec("h100-sxm5-80gb", {"--format", "json"});
  REQUIRE(h100.code == 0);
  const auto d = nlohmann::json::parse(h100.out);
  REQUIRE(d.contains("with_float8"));
  const auto& best = d.at("recommendation");
  const auto& fp8 = d.at("with_float8");
  CHECK(fp8.at("float8") == "rowwise");
  CHECK(best.at("float8") == "none");
  CHECK(fp8.at("strategy") == best.at("strategy"));
  CHECK(fp8.at("time").at("step_s").get<double>() < best.at("time").at("step_s").get<double>());
  const auto text = rec("h100-sxm5-80gb", {});
  REQUIRE(text.code == 0);
  CHECK(has(text.out, fmt::format("with Float8 rowwise (--float8 rowwise; torchao, which changes "
                                  "the numerics): step {:.3f} s instead of {:.3f} s",
                                  fp8.at("time").at("step_s").get<double>(),
                                  best.at("time").at("step_s").get<double>())));
  // No fp8 tensor cores, or Float8 already named: nothing to offer.
  const auto a100 = rec("a100-sxm4-80gb", {"--format", "json"});
  REQUIRE(a100.code == 0);
  CHECK_FALSE(nlohmann::json::parse(a100.out).contains("with_float8"));
  const auto named = rec("h100-sxm5-80gb", {"--float8", "rowwise", "--format", "json"});
  REQUIRE(named.code == 0);
  CHECK_FALSE(nlohmann::json::parse(named.out).contains("with_float8"));
}

// torchtitan's default checkpointing with Float8, eager: its save list sees aten::mm on the Float8
// tensors and keeps every other one, as in bf16 (oracle_float8_units.json), so the block keeps
// the same bytes; what it reruns, wo's and w3's forward, runs in fp8 with its eager casts. By
// hand, per block at T = 4096: the two GEMMs (wo 4096 x 4096 x 4096, w3 4096 x 14,336 x 4096,
// each in 128-wide tiles over 132 SMs at 1024/1056 and 3584/3696 of their waves) take
// 2·(68,719,476,736 + 240,518,168,576)/(1024/1056) FLOP at 989.5 x 0.55 TFLOP/s in bf16, half
// that in fp8: 0.585958 ms saved; their forward casts (x and W of each: 4096·4096 + 4096·4096 +
// 4096·4096 + 14,336·4096 = 109,051,904 elements) move 33 bytes each at 3350 GB/s x 0.92:
// 1.167655 ms added. 32 blocks: 18.614 ms more recompute.
TEST_CASE("float8::torchtitan's op-level save list with Float8") {
  const auto bf16 = titan({"--checkpointing", "selective-op"}, false);
  const auto rowwise = titan({"--checkpointing", "selective-op", "--float8", "rowwise"}, false);
  CHECK(rowwise.at("memory").at("peak_bytes") == bf16.at("memory").at("peak_bytes"));
  const double flops = 2 * (68719476736.0 + 240518168576.0) * 1056 / 1024;
  const double saved = flops / (989.5e12 * 0.55) / 2;
  const double casts = 109051904.0 * 33 / (3350e9 * 0.92);
  CHECK(rowwise.at("time").at("recompute_s").get<double>() -
            bf16.at("time").at("recompute_s").get<double>() ==
        doctest::Approx(32 * (casts - saved)).epsilon(1e-9));
}

// Llama-3-8B compiled under torchtitan at seq 8192 and micro-batch 2 without recompute: 84.2 GiB
// at the least in 16 bits with data parallelism alone, over the H100's 75.7 GiB usable; with
// Float8 the compiled block keeps 4Th + 2TI bytes fewer (32 x (268,435,456 + 469,762,048) =
// 23.6 GB) and the plan fits. (Without --data-parallel-only the search widens to model
// parallelism, where the compiled block under tensor parallelism 2 fits in 16 bits.)
TEST_CASE("float8::recommend says when Float8 makes the job fit") {
  auto a = compiled_8b_recommend();
  a.emplace_back("--data-parallel-only");
  auto json_args = a;
  json_args.insert(json_args.end(), {"--format", "json"});
  const auto r = planner(json_args);
  REQUIRE(r.code == 0);
  const auto d = nlohmann::json::parse(r.out);
  CHECK(d.at("recommendation").is_null());
  REQUIRE(d.contains("with_float8"));
  const auto& f = d.at("with_float8");
  CHECK(f.at("fits") == true);
  CHECK(f.at("float8") == "rowwise");
  CHECK(f.at("micro_batch") == 2);  // the user's, kept
  const auto text = planner(a);
  REQUIRE(text.code == 0);
  CHECK(has(text.out, "NO PLAN FITS (the reasons follow)\nwith Float8 rowwise (--float8 rowwise; "
                      "torchao, which changes the numerics) one does: fsdp-full"));
}

// The layout search says what Float8 gives too, as the data-parallel recommendation does: the
// same job without --data-parallel-only widens to model parallelism (no 16-bit data-parallel
// plan fits), and the fastest layout, tensor parallelism 2 with sequence parallelism, is
// evaluated again with Float8 rowwise (compiled: every linear's fp8 casts, fewer saved tensors),
// faster and smaller (refused before: a compiled block under tensor parallelism).
TEST_CASE("float8::the layout search says what Float8 gives") {
  const auto a = compiled_8b_recommend();
  auto json_args = a;
  json_args.insert(json_args.end(), {"--format", "json"});
  const auto r = planner(json_args);
  REQUIRE(r.code == 0);
  const auto d = nlohmann::json::parse(r.out);
  REQUIRE(d.contains("model_parallel_because"));
  const auto& best = d.at("ranked").at(0);
  REQUIRE(d.contains("with_float8"));
  const auto& f = d.at("with_float8");
  CHECK(f.at("float8") == "rowwise");
  CHECK(f.at("parallelism") == best.at("parallelism"));
  CHECK(f.at("fits") == true);
  CHECK(f.at("time").at("step_s").get<double>() < best.at("time").at("step_s").get<double>());
  CHECK(f.at("memory").at("peak_bytes").get<double>() <
        best.at("memory").at("peak_bytes").get<double>());
  const auto text = planner(a);
  REQUIRE(text.code == 0);
  CHECK(has(text.out, "with Float8 rowwise (--float8 rowwise; torchao, which changes the "
                      "numerics) the fastest layout (tp 2 sp, pp 1, cp 1, dp 4, fsdp-full (fsdp2), "
                      "mb 2, ckpt none): step "));
  // A job that names Float8 gets no such line.
  auto named = json_args;
  named.insert(named.end(), {"--float8", "rowwise"});
  const auto n = planner(named);
  REQUIRE(n.code == 0);
  CHECK_FALSE(nlohmann::json::parse(n.out).contains("with_float8"));
}
