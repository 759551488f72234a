// torchtitan's block compiled as its apply_compile does it, against what the compiled block keeps
// and moves on a CPU (validation/measure_compile_units.py:
// tests/costmodel/data/oracle_compile_units.json; torchtitan 0.3.0, torch's Inductor): per block,
// the bytes AOTAutograd's compiled function saves for backward (costmodel/block_table.cpp,
// compiled_llama_rows), and the bytes its forward's fused kernels and ComplexRoPE's products move
// (costmodel/traffic.cpp, compiled_block_traffic).
#include <doctest/doctest.h>

#include <string>

#include "costmodel/accounting.hpp"
#include "costmodel/traffic.hpp"
#include "documents/model.hpp"
#include "oracle_corpus.hpp"

using namespace shardplan;
using namespace shardplan::costmodel;
using namespace shardplan::documents;

namespace {

TrainingJob case_job(const nlohmann::json& c) {
  TrainingJob j;
  j.recipe = Recipe::torchtitan;
  j.compile = c.at("mode").get<std::string>() == "compiled";
  j.seq_len = c.at("seq_len").get<std::int64_t>();
  j.micro_batch = c.at("micro_batch").get<std::int64_t>();
  j.global_batch = j.micro_batch;
  j.attention = AttentionImpl::flash;
  j.precision =
      c.at("precision").get<std::string>() == "fp32" ? Precision::fp32 : Precision::bf16_mixed;
  j.checkpointing = c.at("checkpointing").get<std::string>() == "full" ? Checkpointing::full
                                                                       : Checkpointing::none;
  return j;
}

// The dtypes the block runs in: fp32, or FSDP2's bf16 parameters with no autocast (torchtitan's
// MixedPrecisionPolicy); on a CPU.
Forward case_forward(const nlohmann::json& c) {
  const double e = c.at("precision").get<std::string>() == "fp32" ? 4 : 2;
  return {e, e, false};
}

}  // namespace

TEST_CASE("oracle_compile::a compiled block keeps what torch.compile's partition saves") {
  const auto corpus = oracle::read_corpus("oracle_compile_units.json");
  int compared = 0;
  for (const auto& c : corpus.at("cases")) {
    if (c.at("mode").get<std::string>() != "compiled") continue;
    CAPTURE(c.at("id").get<std::string>());
    const ModelSpec m = model_from_hf_config(
        corpus.at("configs").at(c.at("config").get<std::string>()), "torchtitan");
    const TrainingJob j = case_job(c);
    const bool full = j.checkpointing == Checkpointing::full;
    const double predicted = block_activations(m, j, case_forward(c), full).saved;
    for (const char* unit : {"block 0", "block 1", "block 2"})
      CHECK(predicted == c.at("units").at(unit).at("activation_bytes").get<double>());
    ++compared;
  }
  // 2 head groupings x 2 dtypes x checkpointing none and full x 4 shapes.
  CHECK(compared == 32);
}

// The forward's memory-bound bytes: Inductor's generated kernels (read and written, as its
// scheduler counts them) and ComplexRoPE's two complex products, which it leaves to ATen.
TEST_CASE("oracle_compile::a compiled block's forward moves its fused kernels' bytes") {
  const auto corpus = oracle::read_corpus("oracle_compile_units.json");
  int compared = 0;
  for (const auto& c : corpus.at("cases")) {
    if (c.at("mode").get<std::string>() != "compiled" ||
        c.at("checkpointing").get<std::string>() != "none")
      continue;
    CAPTURE(c.at("id").get<std::string>());
    const ModelSpec m = model_from_hf_config(
        corpus.at("configs").at(c.at("config").get<std::string>()), "torchtitan");
    double measured = 0, kernels = 0;
    for (const auto& g : c.at("graphs")) {
      if (g.at("unit") != "block" || g.at("pass") != "forward") continue;
      measured += g.at("generated_kernel_read_bytes").get<double>() +
                  g.at("generated_kernel_write_bytes").get<double>();
      const auto& mul = g.at("extern_kernels").at("aten.mul.Tensor");
      measured += mul.at("read_bytes").get<double>() + mul.at("write_bytes").get<double>();
      kernels += g.at("generated_kernels").get<double>() + mul.at("count").get<double>();
    }
    const Traffic t = block_traffic(m, case_job(c), case_forward(c));
    CHECK(t.forward == measured);
    CHECK(t.forward_ops == kernels);
    ++compared;
  }
  CHECK(compared == 16);
}
